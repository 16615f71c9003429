"""Faults done for real: corrupt records, a killed peer, a killed input process, Ctrl-C, a disk
that fills up while a checkpoint is written. CPU, small runs, bounded waits."""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.support.dbfactory import (
    caffe_key,
    datum_record,
    make_jpeg,
    tensorprotos_record,
    write_db,
    write_image_db,
)
from tests.support.trainer_runs import (
    HOOKS,
    REPOSITORY,
    RUN_TIMEOUT_S,
    SMALL_RUN,
    children,
    command_line,
    log_rows,
    one_error_line,
    pause_before_rename,
    process_stat,
    run_trainer,
    signal_as_imported,
    start_long_run,
    start_trainer,
    trainer_command,
    trainer_env,
    training_processes,
    wait_for,
)

TIMEOUT_S = 5  # --timeout of the runs below
TIMEOUT = ["--timeout", str(TIMEOUT_S)]
BATCH_20 = ["--batch_size", "20", "--num_gpus", "2"]


def corrupt_records() -> list[bytes]:
    """One record of each kind that must be skipped, not kill the run."""
    jpeg = make_jpeg(40, 48, seed=1)
    return [
        datum_record(1, encoded=jpeg[: len(jpeg) // 3]),  # truncated JPEG
        b"\x8f\xff garbage \x00\x01\x02" * 4,  # bytes that are no protobuf
        tensorprotos_record(1, encoded=jpeg)[:-9],  # a TensorProtos that lost its label tensor
        datum_record(1, pixels=torch.zeros(0, 0, 3, dtype=torch.uint8).numpy()),  # zero-size image
        datum_record(1, encoded=b"GIF89a not an image"),  # bytes no decoder reads
    ]


def db_with_corrupt_records(path: str, num_records: int) -> tuple[str, list[bytes]]:
    """`num_records` records, the five corrupt kinds spread among them; returns the bad keys."""
    corrupt = corrupt_records()
    spacing = num_records // len(corrupt)
    records: list[tuple[bytes, bytes]] = []
    bad_keys: list[bytes] = []
    for i in range(num_records):
        key = caffe_key(i, f"img{i}.jpg")
        if i % spacing == spacing // 2:
            records.append((key, corrupt[len(bad_keys)]))
            bad_keys.append(key)
        else:
            records.append((key, datum_record(i % 4, encoded=make_jpeg(40, 48, seed=i))))
    return write_db(path, "lmdb", records), bad_keys


def test_one_percent_corrupt_records_are_skipped_and_counted(tmp_path):
    database, bad_keys = db_with_corrupt_records(str(tmp_path / "db"), 500)  # 5 bad: 1%
    done = run_trainer(
        "--train_data", database, *BATCH_20, "--num_epochs", "1", "--log_dir", str(tmp_path)
    )
    assert done.returncode == 0, done.stderr
    assert "Epoch 1: 5 of 500 records skipped as unreadable" in done.stderr
    for key in bad_keys:
        assert f"Skipped undecodable record {key!r}" in done.stderr


def test_five_percent_corrupt_records_stop_the_run_with_one_line(tmp_path):
    database, bad_keys = db_with_corrupt_records(str(tmp_path / "db"), 100)  # 5 bad: 5%
    done = run_trainer(
        "--train_data", database, *BATCH_20, "--num_epochs", "2", "--log_dir", str(tmp_path)
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"5 of 100 records (5.0%) read in epoch 1 of {database}" in errors[0]
    assert all(key.decode() in errors[0] for key in bad_keys)
    assert "--max_bad_records" in errors[0]
    assert not os.path.exists(tmp_path / "resnet50_model_1.pt")  # the epoch was not accepted


@pytest.fixture(scope="module")
def small_db(module_tmp_path):
    return write_image_db(str(module_tmp_path / "db"), 32, 4)


def finish(run: subprocess.Popen, within_s: float) -> tuple[int, str, float]:
    """Wait for the run to end; its status, stderr and seconds taken. Killed if it hangs."""
    started = time.monotonic()
    try:
        _, stderr = run.communicate(timeout=within_s)
    except subprocess.TimeoutExpired:
        run.kill()
        raise AssertionError(f"the run hung: {run.communicate()[1]}") from None
    return run.returncode, stderr, time.monotonic() - started


def test_a_killed_peer_ends_the_run_naming_it(small_db, tmp_path):
    run = start_long_run(small_db, tmp_path, *TIMEOUT, "--num_gpus", "2")
    processes = training_processes(run.pid)
    os.kill(processes[1], signal.SIGKILL)
    status, stderr, seconds = finish(run, TIMEOUT_S + 10)
    assert status != 0
    assert "training process of rank 1" in stderr and "killed by SIGKILL" in stderr, stderr
    assert not any(os.path.exists(f"/proc/{pid}") for pid in processes)
    torch.load(tmp_path / "resnet50_model_1.pt", weights_only=True)


def test_a_killed_input_process_ends_the_run(small_db, tmp_path):
    run = start_long_run(small_db, tmp_path, *TIMEOUT, "--num_workers", "1")
    for pid in children(run.pid):
        os.kill(pid, signal.SIGKILL)
    status, stderr, _ = finish(run, TIMEOUT_S + 10)
    assert status == 1, stderr
    (line,) = [line for line in stderr.splitlines() if "rank 0 stopped: " in line]
    # torch's words where it saw the process dead; ours where it died handing a batch over
    reason = line.split("rank 0 stopped: ", 1)[1]
    assert reason.startswith(("DataLoader worker", "an input (DataLoader) process")), stderr
    assert "Traceback" not in stderr, stderr


def test_a_stopped_input_process_keeps_no_run_going(small_db, tmp_path):
    """An input process that outlives its training process, stopped here (SIGSTOP) as one stuck in
    a read might be: it held the fork server's pipe, so the server never ended and the launcher,
    which waits for it, never exited, after the run's line (red-team, 2 of 2)."""
    run = start_long_run(small_db, tmp_path, *TIMEOUT, "--num_gpus", "2", "--num_workers", "1")
    victim = training_processes(run.pid)[1]
    status, stderr = ended_with_stopped(run, children(victim), then=(victim, signal.SIGKILL))
    assert status == 1, stderr
    assert "rank 0 stopped: " in stderr and "Traceback" not in stderr, stderr


def test_a_stopped_input_process_ends_a_run_of_one_process_after_timeout(small_db, tmp_path):
    """torch's DataLoader waits for a batch without end while its input processes live, and a
    stopped one (SIGSTOP, as one stuck in a read) lives: a run of one process, which has no peer
    whose collective times out, waited for it for as long as it stayed stopped (red-team)."""
    run = start_long_run(small_db, tmp_path, *TIMEOUT, "--num_workers", "1")
    status, stderr = ended_with_stopped(run, children(run.pid))
    assert status == 1, stderr
    lines = [line for line in stderr.splitlines() if "rank 0 stopped: " in line]
    assert len(lines) == 1, stderr
    assert f"no batch came from its input (DataLoader) processes in {TIMEOUT_S} s" in lines[0]
    assert "Traceback" not in stderr, stderr


def ended_with_stopped(
    run: subprocess.Popen, stopped: list[int], then: tuple[int, int] | None = None
) -> tuple[int, str]:
    """The run's status and stderr once it ends with `stopped` (input processes) stopped by
    SIGSTOP, and `then` (pid, signal) sent after (a negative pid: its process group); all of them
    killed in the end."""
    assert stopped
    try:
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        if then is not None:
            os.kill(*then)
        with contextlib.suppress(subprocess.TimeoutExpired):
            run.wait(TIMEOUT_S + 30)  # not communicate(): the stopped ones hold its stderr open
    finally:
        run.kill()
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    status, stderr, _ = finish(run, 30)
    return status, stderr


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_stop_signal_while_an_input_process_is_stopped_ends_the_run(
    small_db, tmp_path, processes
):
    """SIGTERM to the run's group while the last rank's input process is stopped (SIGSTOP, as one
    stuck in a read), with no limit on a batch's wait: the stop is agreed between steps, which the
    waiting rank never reached, and the run never ended. Alone, it saves its last step; with a
    peer, which waits in the next step's collectives, it ends the run in one line, the last
    checkpoint kept (named as the saved position where it is: the rank waited for an epoch's
    first batch). Exit 3 either way: the job requeues and --auto_resume goes on."""
    run = start_long_run(
        small_db, tmp_path, "--timeout", "inf", "--num_gpus", processes, "--num_workers", "1"
    )
    victim = training_processes(run.pid)[-1] if processes == "2" else run.pid
    status, stderr = ended_with_stopped(run, children(victim), then=(-run.pid, signal.SIGTERM))
    assert status == 3, stderr
    line = one_error_line(stderr)
    saved = re.search(r"stopped by SIGTERM at iteration \d+ .*, saved in (\S+\.pt): ", line)
    if saved is None:
        assert processes == "2", stderr
        assert "stopped by SIGTERM while rank 1 waited" in line, stderr
        assert "nothing was saved; restart with the same flags and --auto_resume" in line, stderr
    torch.load(saved[1] if saved else tmp_path / "resnet50_model_1.pt", weights_only=True)


def test_an_input_process_killed_after_the_last_step_changes_nothing(small_db, tmp_path):
    """No batch is wanted once the epochs are done: a death then (here, once the summary is
    printed) left the run's outcome alone but printed torch's SIGCHLD handler's traceback from the
    loader's shutdown (red-team, 5 of 6)."""
    lines = []
    with start_trainer(
        *("--train_data", small_db, "--test_data", small_db, "--num_epochs", "1"),
        *("--num_workers", "2", "--log_dir", str(tmp_path)),
    ) as run:
        assert run.stderr is not None
        for line in run.stderr:
            lines.append(line)
            if line.startswith("Done in"):
                input_processes = children(run.pid)
                assert input_processes
                for pid in input_processes:
                    os.kill(pid, signal.SIGKILL)
        status = run.wait(60)
    stderr = "".join(lines)
    assert status == 0, stderr
    assert "Done in" in stderr and "Traceback" not in stderr, stderr


def test_ctrl_c_stops_every_process_and_keeps_the_last_checkpoint(small_db, tmp_path):
    # SIGTERM saves and stops instead: tests/system/test_preemption.py.
    run = start_long_run(small_db, tmp_path, *TIMEOUT, "--num_gpus", "2")
    processes = training_processes(run.pid)
    # What Ctrl-C in a terminal does: the whole foreground process group gets SIGINT.
    os.killpg(run.pid, signal.SIGINT)
    status, stderr, _ = finish(run, 30)
    assert status == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert not any(os.path.exists(f"/proc/{pid}") for pid in processes)
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".tmp-")]
    checkpoints = [name for name in os.listdir(tmp_path) if name.endswith(".pt")]
    assert len(checkpoints) == 1
    torch.load(tmp_path / checkpoints[0], weights_only=True)


@pytest.mark.parametrize(
    "processes, module",
    [("1", "torch._refs"), ("2", "resnet50_trainer.train.trainer")],
    ids=["as the launcher imports torch", "as the fork server imports the training code"],
)
def test_ctrl_c_as_a_process_imports_is_one_line(small_db, tmp_path, processes, module):
    """Ctrl-C (1.5-4.5 s after the start, by hand) as the launcher imported torch, past its
    FakeTensor module but before torch set its logging: FakeTensor's cache statistics at exit,
    at the root logger's INFO, after "interrupted". As the fork server imported the training code:
    its import's traceback (31-75 lines)."""
    run = start_trainer(
        *("--train_data", small_db, "--num_gpus", processes, "--num_workers", "1"),
        *("--log_dir", str(tmp_path)),
        **signal_as_imported(module, "SIGINT"),
    )
    _, stderr = run.communicate(timeout=RUN_TIMEOUT_S)
    assert run.returncode == 130, stderr
    assert stderr == "resnet50-trainer: interrupted\n"


def test_ctrl_z_then_fg_after_longer_than_timeout_goes_on(small_db, tmp_path):
    """Ctrl-Z to a run of two processes, here reaching rank 0 mid-epoch (after its 5th step) a
    moment before the rest of the job, then fg after longer than --timeout. Stopped at once, rank
    0 left its peer inside the next step's collective, whose limit counted the time stopped: the
    run ended as it was continued, naming a lost peer (by hand, 2 of 3 tries where the whole job
    got it at once). The processes pause together at the next check now. The run is a shell's
    job: a process group of its own in this session (in a session of its own, an orphaned
    group, the kernel discards SIGTSTP)."""
    run = subprocess.Popen(
        trainer_command(
            *("--train_data", small_db, "--num_epochs", "1000", "--log_dir", str(tmp_path)),
            *(*TIMEOUT, "--num_gpus", "2", "--num_workers", "1"),
        ),
        env=trainer_env(
            PYTHONPATH=os.pathsep.join([REPOSITORY, HOOKS]),
            RESNET50_TRAINER_TEST_SIGNAL_AFTER_STEPS="5:SIGTSTP:0:self",
        ),
        text=True,
        stderr=subprocess.PIPE,
        preexec_fn=os.setpgrp,
    )
    try:
        wait_for(lambda: len(training_processes(run.pid)) == 2, RUN_TIMEOUT_S, "2 processes")
        rank_0 = training_processes(run.pid)[0]
        wait_for(lambda: process_stat(rank_0)[0] == "T", RUN_TIMEOUT_S, "rank 0 to stop")
        time.sleep(1)  # rank 1 waits on it meanwhile
        os.killpg(run.pid, signal.SIGTSTP)
        time.sleep(TIMEOUT_S + 3)
        paused_at = epochs_saved(tmp_path)
        os.killpg(run.pid, signal.SIGCONT)
        wait_for(
            lambda: epochs_saved(tmp_path) >= paused_at + 2 or run.poll() is not None,
            RUN_TIMEOUT_S,
            "two more epochs",
        )
        assert run.poll() is None, run.communicate()[1]
        os.killpg(run.pid, signal.SIGTERM)
        status, stderr, _ = finish(run, 60)
        assert status == 3, stderr
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)


def epochs_saved(directory) -> int:
    """The epoch of the newest epoch's checkpoint in `directory` (0: none yet)."""
    names = (re.fullmatch(r"resnet50_model_(\d+)\.pt", name) for name in os.listdir(directory))
    return max((int(name[1]) for name in names if name), default=0)


@pytest.mark.parametrize("parent", ["fork server", "launcher"])
def test_a_killed_launcher_takes_its_training_processes_with_it(small_db, tmp_path, parent):
    """kill -9 leaves the launcher no say: its fork server ends with it (launch/fork_server.py),
    and the training processes then get torch's parent-death signal (SIGINT): they stop and say
    why, the last complete checkpoint kept. The launcher's own children where a TMPDIR too long
    for the server's socket made it spawn them (and made the input processes' socket paths too
    long to hand over a batch, before training processes put them in /tmp)."""
    long_tmpdir = tmp_path / ("t" * 100)
    long_tmpdir.mkdir()
    env = {"TMPDIR": str(long_tmpdir)} if parent == "launcher" else {}
    # Input processes too: a TMPDIR too long for the fork server's socket is too long for theirs.
    run = start_long_run(
        small_db, tmp_path, *TIMEOUT, "--num_gpus", "2", "--num_workers", "1", **env
    )
    processes = training_processes(run.pid)
    if parent == "launcher" and b"spawn_main" not in command_line(processes[0]):
        run.kill()
        run.communicate()
        pytest.skip("this Python puts the fork server's socket in /tmp when TMPDIR is too long")
    started = [*children(run.pid), *processes]
    (parent_pid,) = {int(process_stat(pid)[1]) for pid in processes}
    run.kill()
    _, stderr = run.communicate(timeout=30)  # the pipes close once every process holding them ends
    wait_for(lambda: all(ended(pid) for pid in started), 30, "every process of the run to end")
    assert len(processes) == 2
    errors = [line for line in stderr.splitlines() if "error:" in line]
    said = f"the {parent} .*\\(pid {parent_pid}\\) ended"
    assert any(re.search(said, line) for line in errors), stderr
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".tmp-")]
    torch.load(tmp_path / "resnet50_model_1.pt", weights_only=True)


def test_a_killed_fork_server_fails_the_run_in_one_line(small_db, tmp_path):
    """Its training processes get SIGINT, their parent-death signal, which is not the launcher's
    Ctrl-C: the run fails (it once ended with exit 0, as if done). With input processes, which
    the launcher's end once left a traceback each as they went."""
    run = start_long_run(small_db, tmp_path, *TIMEOUT, "--num_gpus", "2", "--num_workers", "1")
    (server,) = [pid for pid in children(run.pid) if b"forkserver" in command_line(pid)]
    os.kill(server, signal.SIGKILL)
    status, stderr, _ = finish(run, 60)
    assert status == 1, stderr
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    assert f"the fork server it was started from (pid {server}) ended" in errors[0], stderr
    assert f"resume it with --load_model_path {tmp_path}" in errors[0], stderr


def ended(pid: int) -> bool:
    """Gone, or a zombie that no one has reaped yet (an orphan's reaper may be slow)."""
    try:
        return process_stat(pid)[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.fixture
def small_disk(tmpfs) -> Path:
    """A 130 MB tmpfs, room for one ResNet-18 checkpoint (~90 MB) but not two, so the next write
    fills it (ENOSPC). Not RLIMIT_FSIZE where mounting is not permitted: a run refuses a file-size
    limit below its checkpoint before it starts (tests/system/test_machine_limits.py)."""
    return Path(tmpfs("small_disk", "130m"))


def test_a_full_disk_fails_the_checkpoint_and_keeps_the_previous_one(small_db, small_disk):
    directory = small_disk
    first = run_trainer("--train_data", small_db, "--num_epochs", "1", "--log_dir", str(directory))
    assert first.returncode == 0, first.stderr
    previous = (directory / "resnet50_model_1.pt").read_bytes()
    command = trainer_command(
        "--train_data",
        small_db,
        "--num_epochs",
        "2",
        "--log_dir",
        str(directory),
        "--load_model_path",
        str(directory),
    )
    second = subprocess.run(
        command,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert second.returncode == 2, second.stderr
    errors = [line for line in second.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in second.stderr, second.stderr
    assert "writing checkpoint" in errors[0] and "resnet50_model_2.pt failed" in errors[0]
    assert (directory / "resnet50_model_1.pt").read_bytes() == previous
    assert not [
        name
        for name in os.listdir(directory)
        if name.endswith(".pt") and name != "resnet50_model_1.pt"
    ]


RUN_ONE_PROCESS = """
import sys
from resnet50_trainer import cli
from resnet50_trainer.launch import training_process
rank, port = int(sys.argv[1]), int(sys.argv[2])
config = cli.config_from_args(cli.build_parser().parse_args(sys.argv[3:]), gpus_present=0)
training_process.train_as_child_process(rank, config, "127.0.0.1", port)
"""
# What a survivor says, wherever it waited on the lost peer: a collective of the step, the
# all-reduce of the epoch's totals, the checkpoint barrier, ... (Gloo's reason in parentheses);
# the peer it names is the one whose heartbeat on the store stopped.
LOST_PEER = re.compile(
    r"resnet50-trainer: error: rank (\d) stopped: rank (\d) \(shard 0\) of 2 was lost or "
    r"stopped answering during (the [^(]+) \(.+\); the run cannot go on without every "
    r"process: (?:resume it with --load_model_path (?P<resume>\S+)|no checkpoint was saved in "
    r"(?P<again>\S+) yet: run the same command again with --auto_resume)$"
)


def start_ranks(store: dist.TCPStore, ranks, out, *args: str, **env: str) -> list[subprocess.Popen]:
    """Training processes of a 2-process run as independent commands (as on two machines): no
    launcher, they only have each other and the store."""
    argv = [*SMALL_RUN, "--num_gpus", "2", "--log_dir", str(out), *TIMEOUT, *args]
    return [
        subprocess.Popen(
            [sys.executable, "-c", RUN_ONE_PROCESS, str(rank), str(store.port), *argv],
            env=trainer_env(**env),
            text=True,
            stderr=subprocess.PIPE,
        )
        for rank in ranks
    ]


def serve_store(timeout_s: float = 60) -> dist.TCPStore:
    """The meeting point a launcher would serve."""
    return dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def survivor_ends(survivor: subprocess.Popen, processes, within_s: float) -> tuple[int, str]:
    """The survivor's status and stderr; every process is killed afterwards."""
    try:
        status, stderr, _ = finish(survivor, within_s)
    finally:
        for process in processes:
            process.kill()
            process.communicate()
    return status, stderr


def assert_lost_peer_line(stderr: str, rank: int, out) -> str:
    """One line, no traceback (Python's or torch's C++ one), naming the other rank; returns what
    the survivor waited on."""
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in stderr and "frame #" not in stderr, stderr
    line = LOST_PEER.match(errors[0])
    assert line and line[1] == str(rank) and line[2] == str(1 - rank), errors[0]
    # The advice works: a resume where a checkpoint was saved, else the same command with
    # --auto_resume (a checkpoint may go into place after the line: it takes it then).
    assert (line["resume"] or line["again"]) == str(out), errors[0]
    assert not line["resume"] or any(name.endswith(".pt") for name in os.listdir(out))
    return line[3]


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_a_lost_peer_without_a_launcher_to_notice_ends_the_survivor(small_db, tmp_path, fault):
    """As when a whole machine is lost or hangs: only Gloo (a reset connection, or --timeout) can
    tell the survivor. Wherever the survivor waits when that happens (DDP's buffer broadcast, the
    gradient all-reduce, the epoch's totals, the checkpoint barrier: timing decides), it ends the
    same way."""
    store = serve_store()
    survivor, victim = start_ranks(
        store, (0, 1), tmp_path, "--train_data", small_db, "--num_epochs", "1000"
    )
    wait_for(lambda: os.path.exists(tmp_path / "resnet50_model_1.pt"), 180, "the first checkpoint")
    victim.send_signal(fault)
    status, stderr = survivor_ends(survivor, (survivor, victim), TIMEOUT_S + 10)
    assert status == 1, stderr
    assert_lost_peer_line(stderr, 0, tmp_path)


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_a_peer_lost_while_the_other_waits_in_the_checkpoint_barrier_is_named_there(
    small_db, tmp_path, fault
):
    """A known place: rank 0 is held in its checkpoint write (between fsync and rename) when it is
    lost, so rank 1 waits in the checkpoint barrier, under --first_iter_timeout rather than
    --timeout (a write may take long): a hung writer is found when that runs out."""
    store = serve_store()
    barrier_limit_s = 30
    writer, survivor = start_ranks(
        store,
        (0, 1),
        tmp_path,
        "--train_data",
        small_db,
        "--num_epochs",
        "2",
        "--first_iter_timeout",
        str(barrier_limit_s),
        **pause_before_rename(300),
    )
    wait_for(
        lambda: any(name.startswith(".tmp-") for name in os.listdir(tmp_path)),
        180,
        "the checkpoint write",
    )
    writer.send_signal(fault)
    status, stderr = survivor_ends(survivor, (survivor, writer), barrier_limit_s + 20)
    assert status == 1, stderr
    assert assert_lost_peer_line(stderr, 1, tmp_path) == "the checkpoint barrier"


def test_a_checkpoint_slower_than_timeout_is_waited_for(small_db, tmp_path):
    """The others wait in the checkpoint barrier while the first process writes: under
    --first_iter_timeout, not --timeout, which would end the run on slow storage."""
    done = run_trainer(
        "--train_data",
        small_db,
        "--num_gpus",
        "2",
        "--num_epochs",
        "1",
        "--timeout",
        "1",
        "--log_dir",
        str(tmp_path),
        **pause_before_rename(4),  # 4 x --timeout
    )
    assert done.returncode == 0, done.stderr
    torch.load(tmp_path / "resnet50_model_1.pt", weights_only=True)


def test_a_rank_that_never_joins_is_named(small_db, tmp_path):
    store = serve_store()
    (alone,) = start_ranks(
        store, (0,), tmp_path, "--train_data", small_db, "--first_iter_timeout", "3"
    )
    status, stderr = survivor_ends(alone, (alone,), 60)
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert status == 2 and len(errors) == 1 and "Traceback" not in stderr, stderr
    assert (
        "rank 0 could not form the process group: rank 1 (shard 0) of 2 did not join" in errors[0]
    ), errors[0]


STORE_SERVER = """
import sys, time
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
print(store.port, flush=True)
time.sleep(600)
"""


def test_the_store_lost_while_the_group_forms_is_named(small_db, tmp_path):
    """The store's process (a launcher's) killed while rank 0 waits there for rank 1."""
    server = subprocess.Popen(
        [sys.executable, "-c", STORE_SERVER], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None
    port = int(server.stdout.readline())
    client = dist.TCPStore("127.0.0.1", port, is_master=False)
    (alone,) = start_ranks(
        client, (0,), tmp_path, "--train_data", small_db, "--first_iter_timeout", "120"
    )
    wait_for(lambda: client.check(["joined/0"]), 120, "rank 0 to check in")
    server.kill()
    server.communicate()
    status, stderr = survivor_ends(alone, (alone,), 60)
    errors = [line for line in stderr.splitlines() if "error:" in line]
    assert status == 2 and len(errors) == 1, stderr
    assert "Traceback" not in stderr and "frame #" not in stderr, stderr
    assert (
        f"rank 0 lost the run's store at 127.0.0.1:{port} while the process group formed"
        in errors[0]
    )


def run_on_test_records(tmp_path, good: int, bad: int, *args: str) -> str:
    """One epoch of 8 synthetic images, tested on a DB of `good` readable records followed by
    `bad` unreadable ones; the run's stderr."""
    records = [
        (caffe_key(i, f"{i}.jpg"), datum_record(i % 4, encoded=make_jpeg(40, 48, seed=i)))
        for i in range(good)
    ]
    records += [(caffe_key(good + i, "bad.jpg"), b"\x08\x01 garbage") for i in range(bad)]
    test_db = write_db(str(tmp_path / "test"), "lmdb", records)
    done = run_trainer(
        *("--train_data", "null", "--epoch_size", "8", "--num_epochs", "1"),
        *("--test_data", test_db, "--log_dir", str(tmp_path), *args),
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_unreadable_test_records_are_left_out_of_the_test_accuracy_and_counted(tmp_path):
    stderr = run_on_test_records(tmp_path, 10, 2)
    assert "Test accuracy over 10 records: 2 of the test DB's records could not be read" in stderr


@pytest.mark.parametrize("processes", [1, 2])
@pytest.mark.parametrize(
    "bad_records", [1, 8], ids=["last batch one bad record", "a whole batch bad"]
)
def test_unreadable_test_records_never_stop_the_run_however_they_fall_into_batches(
    tmp_path, processes, bad_records
):
    """8 good records, then the bad ones: one process reads them as a batch of its own; two read
    every other record, so rank 0's last batch holds only bad ones."""
    stderr = run_on_test_records(tmp_path, 8, bad_records, "--num_gpus", str(processes))
    assert (
        f"Test accuracy over 8 records: {bad_records} of the test DB's records could not be "
        "read" in stderr
    )
    assert os.path.exists(tmp_path / "resnet50_model_1.pt")
    assert float(log_rows(tmp_path)[0]["test_accuracy"]) >= 0
