"""Nobody else's noise after a fault: a peer killed with kill -9, or a full disk, leaves on the
output only our lines (no DataLoader, logging, torch spawn or resource tracker last words), and the
survivor's documented `rank 0 stopped: ...` line every time. Each try runs with an input process
per training process, where the noise came from; repeated, as it came only some of the time.
(A stop signal's whole output is asserted in tests/system/test_preemption.py.)"""

from __future__ import annotations

import os
import re
import shutil
import signal

import pytest

from tests.support.dbfactory import write_image_db
from tests.support.trainer_runs import (
    run_trainer,
    start_long_run,
    start_trainer,
    training_processes,
    wait_for,
)

TRIES = 2
PROGRESS = re.compile(
    r"ResNet-18, 2 processes x .*|Finished iteration .*|Training loss: .*|Epoch \d+: loss .*"
)


@pytest.fixture(scope="module")
def small_db(module_tmp_path):
    return write_image_db(str(module_tmp_path / "db"), 32, 4)


@pytest.mark.parametrize("attempt", range(TRIES))
def test_a_killed_peer_leaves_our_two_lines_and_nothing_else(small_db, tmp_path, attempt):
    run = start_long_run(
        small_db, tmp_path, "--timeout", "5", "--num_gpus", "2", "--num_workers", "1"
    )
    killed = training_processes(run.pid)[1]
    os.kill(killed, signal.SIGKILL)
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 1, stderr
    ours = [line for line in stderr.splitlines() if not PROGRESS.fullmatch(line)]
    resume = f"resume it with --load_model_path {tmp_path}"
    assert len(ours) == 2, stderr
    assert re.fullmatch(
        r"resnet50-trainer: error: rank 0 stopped: rank 1 \(shard 0\) of 2 was lost or stopped "
        r"answering during .* \(.*\); the run cannot go on without every "
        rf"process: {re.escape(resume)}",
        ours[0],
    ), stderr
    assert ours[1] == (
        f"resnet50-trainer: error: training process of rank 1 (pid {killed}) was killed by "
        f"SIGKILL; the run stopped: {resume}"
    ), stderr


# What a resumed 2-process run says before its checkpoint write fails, besides the progress.
RESUMED = re.compile(r"Resumed from .*")


@pytest.fixture(scope="module")
def first_epoch(small_db, module_tmp_path):
    """A 2-process run's first epoch: its log and checkpoint, which each try resumes from."""
    directory = module_tmp_path / "first_epoch"
    first = run_trainer(*two_processes(small_db), "--num_epochs", "1", "--log_dir", str(directory))
    assert first.returncode == 0, first.stderr
    return directory


def two_processes(db: str) -> tuple[str, ...]:
    return ("--train_data", db, "--num_gpus", "2", "--num_workers", "1")


@pytest.mark.parametrize("attempt", range(TRIES))
def test_a_full_disk_leaves_our_one_line_and_nothing_else(small_db, first_epoch, tmpfs, attempt):
    """The second epoch's checkpoint does not fit on a 130 MB disk (one ResNet-18 checkpoint
    does): the run's line names the write, and nothing of the input processes or of torch's
    spawn follows it."""
    disk = tmpfs("disk", "130m")
    shutil.copytree(first_epoch, disk, dirs_exist_ok=True)
    second = run_trainer(
        *two_processes(small_db), "--num_epochs", "2", "--log_dir", disk, "--load_model_path", disk
    )
    assert second.returncode == 2, second.stderr
    ours = [
        line
        for line in second.stderr.splitlines()
        if not (PROGRESS.fullmatch(line) or RESUMED.fullmatch(line))
    ]
    assert ours == [
        f"resnet50-trainer: error: writing checkpoint {disk}/resnet50_model_2.pt failed (No space "
        "left on device): make --checkpoint_dir writable, with room for a checkpoint, or choose "
        "another; the checkpoints already there are intact"
    ], second.stderr


def test_the_advice_given_before_the_first_checkpoint_works(small_db, tmp_path):
    """A peer killed before the run saved anything: the advice is the same command with
    --auto_resume (a resume from --checkpoint_dir would find nothing), and following it trains
    to the end."""
    command = (
        "--train_data",
        small_db,
        "--num_gpus",
        "2",
        "--num_epochs",
        "1",
        "--log_dir",
        str(tmp_path),
    )
    run = start_trainer(*command, "--timeout", "5")
    wait_for(lambda: len(training_processes(run.pid)) == 2, 60, "two training processes")
    os.kill(training_processes(run.pid)[1], signal.SIGKILL)  # before torch has even loaded
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 1, stderr
    advice = f"no checkpoint was saved in {tmp_path} yet: run the same command again with "
    assert stderr.strip().endswith(advice + "--auto_resume"), stderr
    assert run_trainer(*command, "--timeout", "5", "--auto_resume").returncode == 0
