"""Multi-process runs on CPU with Gloo, each process a real `resnet50-trainer` command: shards
through a real redis-server and through a shared directory, torchrun, concurrent and repeated run
ids, and the failures that must end a run with one line instead of a hang."""

from __future__ import annotations

import csv
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

import pytest
import redis
import torch
import torch.distributed as dist
import torch.utils.data

from resnet50_trainer.distributed import process_group
from tests.support.redis_server import free_port, redis_keys, redis_port  # noqa: F401 (fixture)
from tests.support.trainer_runs import children, trainer_command, trainer_env, wait_for

RECORDS = 32  # batch 8 per machine x 2 machines: 2 steps per epoch
RUN_LIMIT_S = 240  # a hang fails the test instead of blocking CI
# On SMALL_RUN (trainer_command's): one epoch of RECORDS labels.
ONE_EPOCH = ["--num_labels", str(RECORDS), "--num_epochs", "1", "--first_iter_timeout", "120"]


@pytest.fixture
def train_db(image_db):
    # RECORDS labels for RECORDS records: label = record index, so the log's counts name records.
    return image_db("train", RECORDS, RECORDS)


class Run(subprocess.Popen):
    """A trainer process and the directory it writes its log to."""

    log_dir: Path
    stdout: IO[str]  # start() pipes it, as text


def start(tmp_path, name, *flags, launcher=(), environment=None) -> Run:
    """A trainer command in its own process group, writing its log under tmp_path/name."""
    out = tmp_path / name
    out.mkdir()
    command = trainer_command(*ONE_EPOCH, "--log_dir", str(out), *flags)
    if launcher:
        command[:1] = launcher  # in place of the interpreter: `torchrun ... -m resnet50_trainer`
    process = Run(
        command,
        cwd=out,
        env=trainer_env(**(environment or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    process.log_dir = out
    return process


def finish(process, limit_s=RUN_LIMIT_S):
    try:
        output, _ = process.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"run hung past {limit_s} s:\n{output[-3000:]}")
    return process.returncode, output


def assert_trained_one_pass(shard_0, others=()):
    """Every process finished; rank 0's log counts one pass over the DB; all replicas agree."""
    results = [finish(process) for process in (shard_0, *others)]
    for code, output in results:
        assert code == 0, output[-3000:]
    output = results[0][1]
    assert "Parameters identical on all 4 processes" in output, output[-3000:]
    assert "global batch 16, effective LR 0.00625" in output
    (log_path,) = [p for p in shard_0.log_dir.iterdir() if p.suffix == ".log"]
    lines = log_path.read_text().splitlines()
    rows = list(csv.DictReader(line for line in lines if not line.startswith("# ")))
    assert [int(rows[0]["input_count"])] == [RECORDS]  # every record once: the DB is one pass
    return output


def shards(tmp_path, db, run_id, *flags, processes=2, name=""):
    """Shard 1 started first (it must wait for shard 0's address), then shard 0."""
    common = [
        "--train_data",
        db,
        "--num_gpus",
        str(processes),
        "--num_shards",
        "2",
        "--run_id",
        run_id,
        *flags,
    ]
    shard_1 = start(tmp_path, f"{name}shard1", *common, "--shard_id", "1")
    time.sleep(1)
    return start(tmp_path, f"{name}shard0", *common, "--shard_id", "0"), shard_1


def through_redis(port: int) -> list[str]:
    return ["--redis_host", "127.0.0.1", "--redis_port", str(port)]


def shard_of_two(db, shard_id: int, run_id: str, port: int) -> list[str]:
    """The flags of one machine of a run of 2 that meet through the redis-server on `port`."""
    return [
        *("--train_data", db, "--num_shards", "2", "--shard_id", str(shard_id), "--run_id", run_id),
        *through_redis(port),
    ]


def test_two_shards_of_two_processes_through_redis(tmp_path, train_db, redis_port):  # noqa: F811
    shard_0, shard_1 = shards(tmp_path, train_db, "r1", *through_redis(redis_port))
    output = assert_trained_one_pass(shard_0, [shard_1])
    assert "All 2 shards of run r1 met" in output
    assert redis_keys(redis_port) == []


def test_two_shards_of_two_processes_through_a_shared_directory(tmp_path, train_db):
    meeting = tmp_path / "nfs"
    meeting.mkdir()
    shard_0, shard_1 = shards(tmp_path, train_db, "f1", "--file_store_path", str(meeting))
    assert_trained_one_pass(shard_0, [shard_1])
    assert not [name for name in os.listdir(meeting) if "f1" in name]


def test_torchrun_one_node_two_processes(tmp_path, train_db):
    torchrun = [
        os.path.join(os.path.dirname(sys.executable), "torchrun"),
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
    ]
    run = start(
        tmp_path, "torchrun", "--train_data", train_db, "--batch_size", "16", launcher=torchrun
    )
    code, output = finish(run)
    assert code == 0, output[-3000:]
    assert "2 processes x 8 images = global batch 16" in output
    assert "Parameters identical on all 2 processes" in output


def test_two_runs_on_one_redis_at_once_and_a_rerun_after_a_kill(tmp_path, train_db, redis_port):  # noqa: F811
    # A run killed after shard 0 published its address leaves a stale entry under run id "again".
    killed = start(tmp_path, "killed", *shard_of_two(train_db, 0, "again", redis_port))
    deadline = time.monotonic() + 60
    while not redis.Redis(port=redis_port).exists("resnet50_trainer:again:address"):
        assert time.monotonic() < deadline and killed.poll() is None, "shard 0 never published"
        time.sleep(0.2)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.communicate()  # waits, and closes its output pipe
    runs = [
        shards(tmp_path, train_db, run_id, *through_redis(redis_port), processes=1, name=run_id)
        for run_id in ("again", "other")
    ]
    for shard_0, shard_1 in runs:
        code, output = finish(shard_0)
        assert code == 0 and finish(shard_1)[0] == 0, output[-3000:]
        assert "Parameters identical on all 2 processes" in output


def test_a_shard_that_never_starts_is_named(tmp_path, train_db, redis_port):  # noqa: F811
    shard_0 = shard_of_two(train_db, 0, "lonely", redis_port)
    alone = start(tmp_path, "alone", *shard_0, "--first_iter_timeout", "10")
    # The clock starts when the meeting does, after Python and torch have loaded (seconds, here).
    first_line = alone.stdout.readline()
    meeting_started = time.monotonic()
    assert "meeting the others" in first_line
    code, output = finish(alone, limit_s=60)
    assert code != 0 and time.monotonic() - meeting_started < 10 + 10, output
    assert (
        f"shard 1 of 2 did not arrive within 10 s (run_id lonely, redis 127.0.0.1:{redis_port})"
        in output
    )


def test_redis_down_exits_2_naming_host_and_port(tmp_path, train_db):
    port = free_port()
    run = start(tmp_path, "down", *shard_of_two(train_db, 1, "x", port))
    code, output = finish(run, limit_s=60)
    assert code == 2 and f"redis 127.0.0.1:{port}" in output and "Traceback" not in output, output


def test_mpirun_ranks_meet_through_a_shared_directory_without_master_addr(tmp_path, train_db):
    """What mpirun gives each process (OMPI_COMM_WORLD_*), and no MASTER_ADDR: ranks meet by run
    id."""
    meeting = tmp_path / "nfs"
    meeting.mkdir()
    ranks = []
    for rank in (1, 0):
        mpirun = dict(
            OMPI_COMM_WORLD_RANK=str(rank),
            OMPI_COMM_WORLD_SIZE="2",
            OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
            OMPI_COMM_WORLD_LOCAL_SIZE="2",
        )
        ranks.append(
            start(
                tmp_path,
                f"rank{rank}",
                "--train_data",
                train_db,
                "--batch_size",
                "16",
                "--run_id",
                "mpi1",
                "--file_store_path",
                str(meeting),
                environment=mpirun,
            )
        )
    rank_1, rank_0 = ranks
    code, output = finish(rank_0)
    assert code == 0 and finish(rank_1)[0] == 0, output[-3000:]
    assert "All 2 ranks of run mpi1 met" in output
    assert "Parameters identical on all 2 processes" in output


def test_a_peer_that_dies_mid_run_ends_the_others_with_one_line(tmp_path, redis_port):  # noqa: F811
    common = [
        "--train_data",
        "null",
        "--epoch_size",
        "100000",
        "--num_shards",
        "2",
        "--run_id",
        "d1",
        *through_redis(redis_port),
        "--timeout",
        "10",
        "--print_every",
        "2",
    ]
    shard_1 = start(tmp_path, "shard1", *common, "--shard_id", "1")
    shard_0 = start(tmp_path, "shard0", *common, "--shard_id", "0")
    deadline = time.monotonic() + 120
    while "Finished iteration 2/" not in shard_0.stdout.readline():  # past the first step
        assert time.monotonic() < deadline and shard_0.poll() is None, "shard 0 never trained"
    os.killpg(shard_1.pid, signal.SIGKILL)
    killed = time.monotonic()
    code, output = finish(shard_0, limit_s=60)
    assert code == 1 and time.monotonic() - killed < 10 + 5, output
    assert "rank 0 stopped:" in output
    assert "no checkpoint was saved in" in output and "yet: run the same command again" in output
    assert "Traceback" not in output
    shard_1.communicate()


def store_of_the_meeting(directory, run_id: str) -> dist.TCPStore:
    """A client of the store that shard 0 published in the shared directory."""
    path = directory / f"resnet50_trainer.{run_id}.address"
    wait_for(path.exists, 120, "shard 0's entry")
    entry = json.loads(path.read_text())
    return dist.TCPStore(
        entry["host"], entry["port"], is_master=False, timeout=datetime.timedelta(seconds=10)
    )


def test_shard_0_killed_during_the_meeting_is_named_by_the_others_in_one_line(tmp_path):
    """Shard 0 serves the meeting's store: killed while shard 1 waits there for shard 2, it leaves
    shard 1 with one line naming it, not a connection-reset traceback."""
    meeting = tmp_path / "nfs"
    meeting.mkdir()
    common = [
        "--train_data",
        "null",
        "--epoch_size",
        "64",
        "--num_shards",
        "3",
        "--run_id",
        "k1",
        "--file_store_path",
        str(meeting),
    ]
    shard_0 = start(tmp_path, "shard0", *common, "--shard_id", "0")
    shard_1 = start(tmp_path, "shard1", *common, "--shard_id", "1")
    try:
        store = store_of_the_meeting(meeting, "k1")
        wait_for(lambda: store.check(["arrived/1"]), 120, "shard 1 to arrive")
    finally:
        os.killpg(shard_0.pid, signal.SIGKILL)
        shard_0.communicate()
    code, output = finish(shard_1, limit_s=60)
    assert code == 2, output
    errors = [line for line in output.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in output and "frame #" not in output, output
    assert "shard 0 of 3, which serves the meeting's store at 127.0.0.1:" in errors[0], output
    assert "was lost during the meeting" in errors[0] and "run_id k1" in errors[0]


def test_a_dead_input_process_is_not_taken_for_a_lost_peer():
    """The DataLoader's SIGCHLD handler raises wherever the training thread is, also while it waits
    on its peers: that error stays the DataLoader's (distributed/process_group.py names it), it is
    no PeerLost."""
    before = set(children(os.getpid()))
    # A range is a map-style dataset (len and indexing); torch's annotation asks for a Dataset.
    numbers: torch.utils.data.DataLoader[int] = torch.utils.data.DataLoader(
        range(100),  # type: ignore[arg-type]
        batch_size=1,
        num_workers=1,
    )
    batches = iter(numbers)
    next(batches)
    (worker,) = set(children(os.getpid())) - before
    with pytest.raises(RuntimeError) as raised:
        with process_group.waiting_for_peers("a wait in this test"):
            os.kill(worker, signal.SIGKILL)
            time.sleep(30)  # the SIGCHLD handler raises in here
    assert process_group.input_processes_lost(raised.value) is not None, raised.value
    del batches


def test_a_run_of_one_process_has_no_peer_to_blame():
    """A plain error of the step (a shape, a device) in a run of one process keeps its type and
    traceback: there is no peer it could have lost."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        with pytest.raises(RuntimeError, match="channels") as raised:
            with process_group.waiting_for_peers("the step's buffer broadcast"):
                torch.nn.functional.conv2d(torch.zeros(1, 3, 8, 8), torch.zeros(4, 1, 3, 3))
        assert type(raised.value) is RuntimeError
    finally:
        dist.destroy_process_group()


def _agree_on_the_read_order(rank: int, db: str, port: int, out: str) -> None:
    """Process `rank` of 2 (one a machine), each with its own --read_order and --read_window_mb."""
    from resnet50_trainer.cli import build_parser, config_from_args
    from resnet50_trainer.distributed.process_group import placement_for
    from resnet50_trainer.train.inputs import _agreed_read_order

    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    mine = [["--read_order", "quasi_random", "--read_window_mb", "1"], ["--read_order", "random"]]
    flags = ["--train_data", db, "--use_cpu", "--num_shards", "2", "--shard_id", str(rank)]
    flags += ["--run_id", "r", *mine[rank]]
    config = config_from_args(build_parser().parse_args(flags), gpus_present=0)
    order = _agreed_read_order(config, 40, placement_for(config, 0), torch.device("cpu"))
    with open(os.path.join(out, str(rank)), "w") as result:
        json.dump(order.shape, result)
    dist.destroy_process_group()


def test_every_machine_reads_in_the_first_machine_s_order(image_db, tmp_path):
    """Machines given other --read_order and --read_window_mb values still read one global
    stream: the first machine's (here quasi-random in windows of 2 runs, not random)."""
    db = image_db("db", 40, 4)
    port = free_port()
    torch.multiprocessing.spawn(_agree_on_the_read_order, (db, port, str(tmp_path)), nprocs=2)
    shapes = [json.loads((tmp_path / str(rank)).read_text()) for rank in range(2)]
    assert shapes == [[40, 2], [40, 2]]
