"""The commands' standard streams as users leave them, for real: closed at the start (`>&-`,
`2>&-`), a pipe whose reader has gone (`| head`, `| true`), a full device (`>/dev/full`). A run
trains whatever its streams; a command's product on stdout ends quietly on a closed pipe (status
141, as `cat`'s) and in one line on a full device; a refusal keeps its status whatever stderr is."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.trainer_runs import (
    RUN_TIMEOUT_S,
    one_error_line,
    read_log,
    trainer_command,
    trainer_env,
)

SHORT_RUN = ["--train_data", "null", "--num_epochs", "1", "--epoch_size", "32"]
INSPECT = [sys.executable, "-m", "resnet50_trainer.tools.db", "inspect"]
OUTPUT_CLOSED_EXIT_STATUS = 141  # 128 + SIGPIPE, what a shell reports for `cat ... | head -1`


def run_with_closed(fd: int, command: list[str]) -> subprocess.CompletedProcess:
    """`command` with file descriptor `fd` closed before it starts, as `>&-` or `2>&-` leaves it
    (the other standard streams captured)."""
    return subprocess.run(
        command,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        preexec_fn=lambda: os.close(fd),
    )


# stdout's failure was the exit's at any count of processes; stderr's cost a peer where two ran.
@pytest.mark.parametrize("closed, processes", [(1, "1"), (2, "2")], ids=["stdout", "stderr"])
def test_a_run_with_a_standard_stream_closed_trains_saves_and_exits_0(tmp_path, closed, processes):
    """stdout closed: the run trained and saved, then its exit raised AttributeError (sys.stdout
    None), exit 1. stderr closed: the progress bar raised at the first step, exit 1, and with two
    processes the other blamed the first as a lost peer."""
    run = run_with_closed(
        closed, trainer_command(*SHORT_RUN, "--num_gpus", processes, "--log_dir", str(tmp_path))
    )
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "resnet50_model_1.pt").exists()
    assert len(read_log(tmp_path)[2]) == 1  # the epoch's row
    if closed == 1:
        assert "Done in" in run.stderr and "Traceback" not in run.stderr, run.stderr


def closed_pipe() -> int:
    """The write end of a pipe whose reader has gone, as `| head` leaves it once head is done."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    return write_end


def run_into(stdout, command: list[str], database: str) -> subprocess.CompletedProcess:
    """`command` (DB in it replaced by `database`) with its stdout on `stdout`, stderr captured."""
    return subprocess.run(
        [database if word == "DB" else word for word in command],
        env=trainer_env(),
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "command",
    [[*INSPECT, "DB", "--json"], [*INSPECT, "--help"], trainer_command("--help")],
    ids=["inspect", "inspect --help", "trainer --help"],
)
def test_output_into_a_closed_pipe_ends_quietly_as_cat_does(image_db, command):
    """A BrokenPipeError traceback, exit 1 (`inspect | true` every time; `| head -c 20` when
    head left first)."""
    pipe = closed_pipe()
    try:
        done = run_into(pipe, command, image_db("db", 4, 2))
    finally:
        os.close(pipe)
    assert done.returncode == OUTPUT_CLOSED_EXIT_STATUS, done.stderr
    assert done.stderr == ""


@pytest.mark.parametrize(
    "command", [[*INSPECT, "DB"], trainer_command("--help")], ids=["inspect", "trainer --help"]
)
def test_output_onto_a_full_device_is_one_line_and_exit_1(image_db, command):
    """inspect: an ENOSPC traceback; --help: exit 0, the help lost without a word."""
    with open("/dev/full", "w") as full:
        done = run_into(full, command, image_db("db", 4, 2))
    assert done.returncode == 1, done.stderr
    assert one_error_line(done.stderr).endswith(
        "error: cannot write to standard output (No space left on device): the output is "
        "incomplete; free space where it goes"
    )


@pytest.mark.parametrize(
    "command", [[*INSPECT, "DB", "--bogus"], trainer_command("--bogus")], ids=["db", "trainer"]
)
def test_a_refusal_exits_2_whatever_stderr_is(image_db, command):
    """With stderr on a full device its one line failed in a traceback, which failed too: exit 1."""
    database = image_db("db", 4, 2)
    for stderr in ("/dev/full", "closed"):
        argv = [database if word == "DB" else word for word in command]
        if stderr == "closed":
            done = run_with_closed(2, argv)
        else:
            with open(stderr, "w") as full:
                done = subprocess.run(argv, env=trainer_env(), stderr=full, timeout=120)
        assert done.returncode == 2, stderr
