"""A run log or profiler trace that cannot be written (a real tmpfs, filled up) ends the run with
one line naming the file and the reason, exit 2; what was there before is intact, and a file the
run made but could not complete is removed."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from resnet50_trainer.errors import UserError
from resnet50_trainer.reporting.runlog import HEADER, EpochRow, RunLog
from tests.support.trainer_runs import config_of, fill_up, one_error_line, run_trainer

SYNTHETIC = ["--train_data", "null", "--epoch_size", "64", "--num_epochs", "1"]  # 8 steps
EARLIER = b"an earlier run's log\n"


def disk_with_an_earlier_file(tmpfs, size: str, leave_bytes: int = 0) -> str:
    directory = tmpfs("disk", size)
    with open(os.path.join(directory, "earlier.log"), "wb") as file:
        file.write(EARLIER)
    fill_up(directory, leave_bytes)
    return directory


def left_in(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name != "filler")


@pytest.mark.parametrize("processes", [1, 2])
def test_a_log_whose_header_does_not_fit_is_removed(tmpfs, tmp_path, processes):
    directory = disk_with_an_earlier_file(tmpfs, "64k")
    run = run_trainer(
        *SYNTHETIC,
        "--num_gpus",
        str(processes),
        "--log_dir",
        directory,
        "--checkpoint_dir",
        str(tmp_path / "checkpoints"),
    )
    assert run.returncode == 2, run.stderr
    line = one_error_line(run.stderr)
    assert f"error: writing the run log {directory}/resnet50_gpu{processes}_b8_" in line
    assert "failed (No space left on device): free space in --log_dir or choose another" in line
    assert left_in(directory) == ["earlier.log"]
    with open(os.path.join(directory, "earlier.log"), "rb") as file:
        assert file.read() == EARLIER


def test_a_row_that_does_not_fit_is_cut_off_and_the_rows_before_stay(tmpfs):
    directory = tmpfs("disk", "64k")
    run_log = RunLog(
        config_of("--train_data", "null", "--use_cpu", "--log_dir", directory), time.time()
    )
    fill_up(directory)

    def row(epoch: int) -> EpochRow:
        return EpochRow(1.5, 1.5 * epoch, 64, 64 * epoch, epoch, 42.7, 0.5, epoch, 0.1, 2.3, -1)

    rows = 0
    with pytest.raises(UserError) as raised:
        for rows in range(1000):  # until the log's last block is full
            run_log.write(row(rows))
    run_log.close()
    assert str(raised.value) == (
        f"writing the run log {run_log.path} failed (No space left on "
        "device): free space in --log_dir or choose another; the rows "
        "already written are intact"
    )
    with open(run_log.path) as file:
        lines = file.read().split("\n")
    assert len(lines) == 2 + rows + 1 and lines[-1] == ""  # whole lines only
    last = row(rows - 1)
    assert lines[-2] == ",".join(str(getattr(last, column)) for column in HEADER)


def scratch_env(scratch, tmp_path) -> dict[str, str]:
    """`scratch` the run's TMPDIR, and torch's compile cache elsewhere: torch makes it in TMPDIR
    as dynamo is imported, unless TORCHINDUCTOR_CACHE_DIR names it (and a pytest worker that has
    imported dynamo names it for every run it starts, so the tests that ran first decided these)."""
    return {"TMPDIR": str(scratch), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch_cache")}


@pytest.mark.parametrize("processes", [1, 2])
def test_a_trace_that_does_not_fit_is_removed_and_the_log_kept(tmpfs, tmp_path, processes):
    directory = disk_with_an_earlier_file(tmpfs, "256k", leave_bytes=64 << 10)  # a log, no trace
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    run = run_trainer(
        *SYNTHETIC,
        "--num_gpus",
        str(processes),
        "--profile_iters",
        "2",
        "--log_dir",
        directory,
        "--checkpoint_dir",
        str(tmp_path / "checkpoints"),
        **scratch_env(scratch, tmp_path),
    )
    assert run.returncode == 2, run.stderr
    (log,) = [name for name in left_in(directory) if name.startswith("resnet50_")]
    trace = os.path.join(directory, log[: -len(".log")] + ".trace.json.gz")
    assert one_error_line(run.stderr).endswith(
        f"error: writing the profiler trace {trace} failed (No space left on device): free space "
        "in --log_dir or choose another; the files already there are intact"
    )
    assert left_in(directory) == ["earlier.log", log]
    with open(os.path.join(directory, log)) as file:
        assert file.read().splitlines()[1].startswith("time_spent,")  # the header, whole
    assert os.listdir(scratch) == []


def test_a_trace_the_profiler_cannot_write_in_its_scratch_directory_is_named(tmpfs, tmp_path):
    scratch = tmpfs("scratch", "64k")
    fill_up(scratch, leave_bytes=8 << 10)  # Python takes a TMPDIR only where it can write a file
    run = run_trainer(
        *SYNTHETIC,
        "--profile_iters",
        "2",
        "--log_dir",
        str(tmp_path),
        **scratch_env(scratch, tmp_path),
    )
    assert run.returncode == 2, run.stderr
    assert f"error: the profiler could not write its trace in {scratch}" in one_error_line(
        run.stderr
    )
    assert not [name for name in os.listdir(tmp_path) if ".trace.json" in name]
    assert os.listdir(scratch) == ["filler"]


def test_a_log_whose_directory_is_removed_mid_run_is_a_write_failure(tmp_path):
    """Writes to a removed file succeed and vanish with it: the run must not go on logging into
    nothing and report a log that no longer exists."""
    directory = tmp_path / "logs"
    directory.mkdir()
    run_log = RunLog(
        config_of("--train_data", "null", "--use_cpu", "--log_dir", str(directory)), time.time()
    )
    shutil.rmtree(directory)
    with pytest.raises(
        UserError,
        match=r"the run log .* is gone \(the log was removed while the "
        r"run wrote it\): its directory or the file was removed",
    ):
        run_log.write(EpochRow(1.5, 1.5, 64, 64, 1, 42.7, 0.5, 1, 0.1, 2.3, -1))
    run_log.close()
