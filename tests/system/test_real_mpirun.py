"""The manual's mpirun forms under a real Open MPI mpirun (Debian's openmpi-bin, installed by
scripts/setup.sh), on the CPU: one rank per process meeting at MASTER_ADDR:MASTER_PORT (mpirun -x)
or through a directory (the run id: mpirun's job id), and one rank per machine with --num_gpus 2,
the original's way. Every run ends with the same parameters on all its processes."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.support.redis_server import free_port
from tests.support.trainer_runs import RUN_TIMEOUT_S, SMALL_RUN, trainer_env

MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(
    MPIRUN is None, reason="no mpirun on this machine (scripts/setup.sh installs openmpi-bin)"
)
# Root in a container, 2 ranks on a 2-core machine: Open MPI refuses both unless told.
MPIRUN_AS_HERE = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
RECORDS = 32
DIGEST = re.compile(r"Parameters identical on all (\d+) processes \(sha256 ([0-9a-f]{64})\)")


def mpirun(
    tmp_path, db: str, ranks: int, *flags: str, launcher_args: tuple[str, ...] = ()
) -> tuple[int, str]:
    """`mpirun -np ranks launcher_args resnet50-trainer ... flags` to its end: status, output."""
    assert MPIRUN is not None  # pytestmark skips the module without one
    command = [
        MPIRUN,
        *MPIRUN_AS_HERE,
        "-np",
        str(ranks),
        *launcher_args,
        sys.executable,
        "-m",
        "resnet50_trainer",
        *SMALL_RUN,
        "--train_data",
        db,
        "--num_labels",
        str(RECORDS),
        "--num_epochs",
        "1",
        "--log_dir",
        str(tmp_path),
        *flags,
    ]
    # mpirun passes its own environment on; PYTHONPATH makes every rank import this checkout.
    done = subprocess.run(
        command,
        env=trainer_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    return done.returncode, done.stdout + done.stderr


def trained_on(output: str, processes: int) -> str:
    """The run's digest, once every one of its `processes` had the same parameters."""
    found = DIGEST.findall(output)
    assert [count for count, _ in found] == [str(processes)], output[-3000:]
    return found[0][1]


@pytest.fixture
def train_db(image_db):
    return image_db("train", RECORDS, RECORDS)


def test_one_rank_per_process_meeting_at_master_addr(tmp_path, train_db):
    port = str(free_port())
    status, output = mpirun(
        tmp_path,
        train_db,
        2,
        launcher_args=("-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={port}"),
    )
    assert status == 0, output[-3000:]
    trained_on(output, 2)


def test_one_rank_per_process_meeting_through_a_directory(tmp_path, train_db):
    """No MASTER_ADDR: the ranks meet in --file_store_path under mpirun's job id as run id."""
    meeting = tmp_path / "meet"
    meeting.mkdir()
    status, output = mpirun(tmp_path, train_db, 2, "--file_store_path", str(meeting))
    assert status == 0, output[-3000:]
    trained_on(output, 2)
    assert os.listdir(meeting) == []  # the meeting's entry goes with the run


def test_one_rank_per_machine_starts_its_num_gpus_processes(tmp_path, train_db):
    """The original's way on one machine: mpirun's one rank starts --num_gpus 2 processes."""
    status, output = mpirun(tmp_path, train_db, 1, "--num_gpus", "2")
    assert status == 0, output[-3000:]
    trained_on(output, 2)
    assert "2 processes x 4 images = global batch 8" in output, output[-3000:]
