"""mpirun (and srun, MPICH's mpiexec) the original's way: one rank per machine, which starts the
machine's --num_gpus processes itself. Two simulated machines of two CPU processes each meet through
a shared directory, Redis and MASTER_ADDR:MASTER_PORT; a launch that does not add up is refused."""

from __future__ import annotations

import os
import socket
import time

import pytest

from resnet50_trainer.config.launchers import Launched, detect_launcher
from resnet50_trainer.errors import UserError
from tests.support.redis_server import free_port, redis_keys, redis_port  # noqa: F401 (fixture)
from tests.support.trainer_runs import config_of, one_error_line, refused_in_process

# train_db: a fixture.
from tests.system.test_distributed import assert_trained_one_pass, finish, start, train_db  # noqa: F401


def mpirun_environment(rank: int, per_machine: int = 1, **extra: str) -> dict:
    """What Open MPI's mpirun gives a process on 2 machines: `mpirun -np 2 -npernode 1` by
    default."""
    return {
        "OMPI_COMM_WORLD_RANK": str(rank),
        "OMPI_COMM_WORLD_SIZE": str(2 * per_machine),
        "OMPI_COMM_WORLD_LOCAL_RANK": str(rank % per_machine),
        "OMPI_COMM_WORLD_LOCAL_SIZE": str(per_machine),
        **extra,
    }


def mpirun(extra: dict[str, str]) -> Launched:
    """Rank 1 of 2, one a machine, under mpirun with `extra` in its environment."""
    launched = detect_launcher({**mpirun_environment(1), **extra})
    assert launched is not None
    return launched


MASTER = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_one_rank_per_machine_trains_every_gpu_of_it_with_the_machine_s_batch():
    """`mpirun -np 2 ... --num_gpus 8 --batch_size 256`: 8 processes a machine, 32 images each."""
    settings = config_of(
        *("--train_data", "null", "--num_gpus", "8", "--batch_size", "256"),
        gpus_present=8,
        launched=mpirun(MASTER),
    )
    assert settings.gpus == tuple(range(8)) and settings.processes_per_machine == 8
    assert (settings.num_shards, settings.shard_id, settings.world_size) == (2, 1, 16)
    assert (settings.device_batch_size, settings.global_batch_size) == (32, 512)
    assert settings.run_id is None  # they meet at MASTER_ADDR:MASTER_PORT
    pairs = config_of(
        *("--train_data", "null", "--model_parallel", "--num_gpus", "4"),
        gpus_present=8,
        launched=mpirun(MASTER),
    )
    assert (pairs.gpus, pairs.processes_per_machine) == (tuple(range(8)), 4)
    # Without --num_gpus the original trained on one GPU per machine; so do we.
    alone = config_of("--train_data", "null", gpus_present=8, launched=mpirun(MASTER))
    assert (alone.gpus, alone.processes_per_machine) == ((0,), 1)


@pytest.mark.parametrize(
    "environment, run_id",
    [
        (mpirun_environment(1, OMPI_MCA_orte_ess_jobid="3145859073"), "3145859073"),
        (mpirun_environment(1, PMIX_NAMESPACE="prterun-node7-4711@1"), "prterun-node7-4711_1"),
        # Open MPI's own id first: one SLURM job may hold several runs.
        (mpirun_environment(1, OMPI_MCA_orte_ess_jobid="7", SLURM_JOB_ID="99"), "7"),
        (
            {
                **dict(SLURM_PROCID="1", SLURM_NTASKS="2", SLURM_LOCALID="0"),
                **dict(SLURM_STEP_TASKS_PER_NODE="1(x2)", SLURM_JOB_ID="4711"),
            },
            "4711",
        ),
        ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"}, "r"),
    ],
)
def test_each_launcher_s_one_rank_per_machine_is_a_shard_named_by_its_job(environment, run_id):
    launched = detect_launcher(environment)
    flags = ["--train_data", "null", "--use_cpu", "--num_gpus", "2", "--file_store_path", "/nfs"]
    if run_id == "r":  # MPICH's Hydra gives no job id
        flags += ["--run_id", "r"]
    settings = config_of(*flags, launched=launched)
    assert (settings.num_shards, settings.shard_id, settings.processes_per_machine) == (2, 1, 2)
    assert settings.run_id == run_id


@pytest.mark.parametrize(
    "environment, flags, problem",
    [
        (
            dict(mpirun_environment(3, per_machine=4), **MASTER),
            ["--num_gpus", "8"],
            "mpirun started 4 processes on this machine but --num_gpus/--gpus ask for 8: use "
            "one form, one rank per GPU (leave --num_gpus/--gpus out) or one rank per machine "
            "(mpirun --map-by ppr:1:node, --num_gpus 8)",
        ),
        (
            dict(mpirun_environment(3, per_machine=4), **MASTER),
            ["--num_gpus", "1"],
            "use one form",
        ),
        (
            dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", **MASTER),
            ["--num_gpus", "2"],
            "give it --nproc-per-node 2 and leave --num_gpus/--gpus out",
        ),
        (
            dict(mpirun_environment(1), **MASTER),
            ["--num_gpus", "2", "--num_shards", "3"],
            "places this process on machine 1 of 2, but --num_shards/--shard_id say otherwise",
        ),
        (
            dict(mpirun_environment(0), **MASTER),
            ["--num_gpus", "2", "--num_shards", "2", "--shard_id", "1"],
            "--num_shards/--shard_id say otherwise: leave them out",
        ),
        (
            mpirun_environment(1, OMPI_MCA_orte_ess_jobid="7"),
            ["--num_gpus", "2"],
            "mpirun started 2 machines but no way for them to meet: set MASTER_ADDR and "
            "MASTER_PORT (rank 0's machine and a free port there), or give --redis_host, or "
            "--file_store_path on a directory every machine shares (not /tmp)",
        ),
        (
            mpirun_environment(1),
            ["--num_gpus", "2", "--file_store_path", "/nfs"],
            "mpirun without MASTER_ADDR needs --run_id",
        ),
        (
            dict(mpirun_environment(1), **MASTER),
            ["--num_gpus", "2", "--batch_size", "9"],
            "--batch_size 9 does not divide by the 2 devices of this machine",
        ),
    ],
)
def test_a_launch_that_does_not_add_up_is_refused_in_one_line(environment, flags, problem):
    with pytest.raises(UserError) as refused:
        config_of(
            "--train_data", "null", "--use_cpu", *flags, launched=detect_launcher(environment)
        )
    assert problem in str(refused.value) and "\n" not in str(refused.value), refused.value


def test_the_command_refuses_it_with_exit_2_and_writes_nothing(capsys, monkeypatch, tmp_path):
    for name, value in mpirun_environment(0, per_machine=4).items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    line = refused_in_process(capsys, "--train_data", "null", "--num_gpus", "2")
    assert "use one form" in line
    assert os.listdir(tmp_path) == []


def two_machines(tmp_path, db, *flags, **environment):
    """Rank 1 started first (it must wait for rank 0), then rank 0: each a machine of 2 CPU
    processes under mpirun's environment."""
    common = ["--train_data", db, "--num_gpus", "2", *flags]
    rank_1 = start(tmp_path, "rank1", *common, environment=mpirun_environment(1, **environment))
    time.sleep(1)
    rank_0 = start(tmp_path, "rank0", *common, environment=mpirun_environment(0, **environment))
    return rank_0, rank_1


def test_two_machines_of_two_processes_through_a_shared_directory(tmp_path, train_db):  # noqa: F811
    meeting = tmp_path / "nfs"
    meeting.mkdir()
    rank_0, rank_1 = two_machines(
        tmp_path, train_db, "--file_store_path", str(meeting), OMPI_MCA_orte_ess_jobid="31458"
    )
    output = assert_trained_one_pass(rank_0, [rank_1])
    assert "All 2 shards of run 31458 met" in output
    assert os.listdir(meeting) == []


def test_two_machines_of_two_processes_through_redis(tmp_path, train_db, redis_port):  # noqa: F811
    rank_0, rank_1 = two_machines(
        tmp_path,
        train_db,
        *("--redis_host", "127.0.0.1", "--redis_port", str(redis_port)),
        PMIX_NAMESPACE="prterun-node7-4711@1",
    )
    output = assert_trained_one_pass(rank_0, [rank_1])
    assert "All 2 shards of run prterun-node7-4711_1 met" in output
    assert redis_keys(redis_port) == []


def test_two_machines_of_two_processes_at_master_addr(tmp_path, train_db):  # noqa: F811
    port = free_port()
    rank_0, rank_1 = two_machines(
        tmp_path, train_db, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    output = assert_trained_one_pass(rank_0, [rank_1])
    assert f"Shard 0 of 2: meeting the others at MASTER_ADDR:MASTER_PORT 127.0.0.1:{port}" in output


def alone_at_master(tmp_path, rank: int, port: int):
    """One machine's rank of a run of 2 that meets at 127.0.0.1:`port`, run to its end."""
    environment = mpirun_environment(rank, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    flags = ["--train_data", "null", "--num_gpus", "2", "--first_iter_timeout", "3"]
    code, output = finish(start(tmp_path, f"rank{rank}", *flags, environment=environment), 60)
    assert code == 2, output
    assert "Traceback" not in output and "frame #" not in output, output
    return one_error_line(output)


def test_a_machine_whose_rank_0_never_starts_names_master_addr(tmp_path):
    port = free_port()
    assert (
        f"shard 1 of 2 found no store at MASTER_ADDR:MASTER_PORT 127.0.0.1:{port} by the "
        "deadline (Connection refused): start rank 0"
    ) in alone_at_master(tmp_path, 1, port)


def test_rank_0_on_a_master_port_in_use_is_one_line(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        line = alone_at_master(tmp_path, 0, taken.getsockname()[1])
    assert "shard 0 of 2 could not serve the run's store (is MASTER_PORT free" in line
    assert "EADDRINUSE" in line
