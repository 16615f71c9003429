"""Nobody else's noise after a fault: a peer killed with kill -9 leaves on the survivor's output
only our lines (no DataLoader, logging, torch spawn or resource tracker last words), and the
survivor's documented `rank 0 stopped: ...` line every time. Each try runs with an input process
per training process, where the noise came from; repeated, as it came only some of the time.
(A stop signal's whole output is asserted in tests/test_preemption.py.)"""

from __future__ import annotations

import os
import re
import signal

import pytest

from dbfactory import write_image_db
from trainer_runs import start_long_run, training_processes

TRIES = 3
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
