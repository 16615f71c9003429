"""Placement and settings of distributed runs, without starting any: launcher environments, the
--run_id requirement, transport checks, and which records each rank of 2 shards x 2 reads."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from resnet50_trainer.cli import build_parser, config_from_args, main
from resnet50_trainer.config.launchers import detect_launcher
from resnet50_trainer.data.order import RecordOrder, ShardBatchSampler
from resnet50_trainer.distributed.process_group import placement_for
from resnet50_trainer.distributed.transport import advertised_host, transport_environment
from resnet50_trainer.errors import UserError
from tests.support.trainer_runs import launched

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}
SRUN = {
    "SLURM_PROCID": "2",
    "SLURM_NTASKS": "4",
    "SLURM_LOCALID": "0",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_ID": "4711",
}
MPIRUN = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}


def config(*flags, launched=None):
    args = build_parser().parse_args(["--train_data", "null", "--use_cpu", *flags])
    return config_from_args(args, gpus_present=0, launched=launched)


def test_launcher_environments():
    torchrun, srun, mpirun = (launched(env) for env in (TORCHRUN, SRUN, MPIRUN))
    assert (torchrun.name, torchrun.rank, torchrun.machine_index, torchrun.num_machines) == (
        "torchrun",
        3,
        1,
        2,
    )
    assert torchrun.master == ("10.0.0.1", 29500)
    assert (srun.rank, srun.local_world_size, srun.machine_index, srun.master, srun.job_id) == (
        2,
        2,
        1,
        None,
        "4711",
    )
    assert (mpirun.name, mpirun.local_rank, mpirun.num_machines) == ("mpirun", 1, 1)
    # An sbatch script's own shell has SLURM variables but no step: not a launcher.
    without_step = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_TASKS_PER_NODE"}
    assert detect_launcher(without_step) is None
    assert detect_launcher({}) is None


def test_uneven_processes_per_machine_are_refused():
    with pytest.raises(UserError, match="start the same number of processes on every machine"):
        detect_launcher(dict(SRUN, SLURM_STEP_TASKS_PER_NODE="2,1"))
    with pytest.raises(UserError, match="same number on every machine"):
        detect_launcher(dict(TORCHRUN, WORLD_SIZE="3"))


@pytest.mark.parametrize(
    "variable, value, problem",
    [
        ("LOCAL_WORLD_SIZE", "0", "at least one process"),
        ("WORLD_SIZE", "0", "at least one process"),
        ("RANK", "4", "not below WORLD_SIZE=4"),
        ("LOCAL_RANK", "2", "not below LOCAL_WORLD_SIZE=2"),
        ("RANK", "-1", "is not a whole number (0 or more)"),
        ("MASTER_PORT", "0", "not a port number"),
        ("MASTER_PORT", "70000", "not a port number"),
        ("MASTER_PORT", "http", "not a port number"),
        ("MASTER_ADDR", "", "MASTER_ADDR is empty"),
    ],
)
def test_a_launcher_environment_that_places_no_process_is_one_line(
    variable, value, problem, capsys, monkeypatch, tmp_path
):
    for name, setting in dict(TORCHRUN, **{variable: value}).items():
        monkeypatch.setenv(name, setting)
    monkeypatch.chdir(tmp_path)
    assert main(["--train_data", "null", "--use_cpu"]) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and problem in stderr and variable in stderr, stderr
    assert os.listdir(tmp_path) == []


def test_a_launcher_places_the_machine_and_batch_stays_per_machine():
    settings = config("--batch_size", "8", launched=detect_launcher(TORCHRUN))
    assert (settings.num_shards, settings.shard_id, settings.processes_per_machine) == (2, 1, 2)
    assert (settings.device_batch_size, settings.global_batch_size) == (4, 16)
    assert settings.run_id is None  # torchrun's MASTER_ADDR is the meeting point
    srun = detect_launcher(SRUN)  # without MASTER_ADDR: the machines meet in a shared directory
    assert config("--file_store_path", "/nfs", launched=srun).run_id == "4711"
    with pytest.raises(UserError, match="mpirun without MASTER_ADDR needs --run_id"):
        config(launched=detect_launcher(MPIRUN))
    with pytest.raises(UserError, match="leave them out"):
        config("--num_shards", "3", launched=detect_launcher(TORCHRUN))


def test_run_id_is_required_for_several_shards_and_must_be_a_plain_name(capsys):
    assert main(["--train_data", "null", "--use_cpu", "--num_shards", "2"]) == 2
    assert capsys.readouterr().err.strip() == (
        "resnet50-trainer: error: --num_shards 2 needs --run_id: give every machine the same "
        "new id, e.g. --run_id $(uuidgen)"
    )
    with pytest.raises(UserError, match="may hold only letters"):
        config("--num_shards", "2", "--run_id", "../etc")
    assert config().run_id is None  # one machine needs neither Redis nor a directory


def test_transport_combinations():
    with pytest.raises(UserError, match="ibverbs needs GPUs"):
        config("--distributed_transport", "ibverbs")
    with pytest.raises(UserError, match="names no-such-nic, not a network interface"):
        config("--distributed_interfaces", "lo,no-such-nic")
    assert config("--distributed_interfaces", "lo").distributed_interfaces == "lo"
    assert advertised_host("lo", "tcp", None) == "127.0.0.1"
    assert advertised_host("", "tcp", "127.0.0.1") == "127.0.0.1"  # the route to Redis


@pytest.mark.parametrize(
    ("transport", "interfaces", "environ", "set_"),
    [
        # No flag: NCCL picks its transport (InfiniBand where it finds it); nothing is set.
        (None, "", {}, {}),
        (None, "eth0", {}, {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}),
        (
            "tcp",
            "eth0,eth1",
            {},
            {
                "NCCL_IB_DISABLE": "1",
                "NCCL_SOCKET_IFNAME": "eth0,eth1",
                "GLOO_SOCKET_IFNAME": "eth0,eth1",
            },
        ),
        ("ibverbs", "mlx5_0", {}, {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "mlx5_0"}),
        # A variable the user set wins over the flags.
        ("tcp", "", {"NCCL_IB_DISABLE": "0"}, {}),
        ("ibverbs", "mlx5_0", {"NCCL_IB_HCA": "mlx5_1"}, {"NCCL_IB_DISABLE": "0"}),
    ],
)
def test_transport_environment(transport, interfaces, environ, set_):
    assert transport_environment(transport, interfaces, environ) == set_


def test_two_shards_of_two_processes_read_each_record_once_per_epoch():
    """The layout of the 2 x 2 end-to-end test: global rank = shard x 2 + local index."""
    settings = config("--num_shards", "2", "--run_id", "r", "--num_gpus", "2", "--batch_size", "8")
    records, epochs = 32, 2
    order = RecordOrder(records, settings.seed)
    steps = settings.iterations_per_epoch(records)
    for epoch in range(epochs):
        read: Counter[int] = Counter()
        ranks = []
        for shard in range(2):
            shard_config = config(
                "--num_shards",
                "2",
                "--shard_id",
                str(shard),
                "--run_id",
                "r",
                "--num_gpus",
                "2",
                "--batch_size",
                "8",
            )
            for local in range(2):
                placement = placement_for(shard_config, local)
                ranks.append(placement.rank)
                sampler = ShardBatchSampler(
                    order,
                    steps,
                    settings.global_batch_size,
                    settings.device_batch_size,
                    placement.rank,
                )
                sampler.set_epoch(epoch)
                read.update(index for step in sampler for _, index in step.items)
        assert ranks == [0, 1, 2, 3]
        assert read == Counter(range(records))


@pytest.mark.parametrize(
    "environment",
    [
        {"RANK": "0", "WORLD_SIZE": "2"},
        {"RANK": "abc", "WORLD_SIZE": "2", "LOCAL_RANK": "0"},
        {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
    ],
)
def test_a_part_of_a_launcher_s_variables_is_refused_not_run_alone(
    environment, capsys, monkeypatch, tmp_path
):
    """torchrun and mpirun set all four; a part is a hand-made environment, which would otherwise
    train alone as if no launcher had started it."""
    for name, setting in environment.items():
        monkeypatch.setenv(name, setting)
    monkeypatch.chdir(tmp_path)
    assert main(["--train_data", "null", "--use_cpu"]) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and "set but not" in stderr, stderr
    assert os.listdir(tmp_path) == []
