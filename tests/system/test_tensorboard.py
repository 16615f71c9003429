"""--tensorboard: event files next to the run log, read back with TensorBoard's own reader: the
log's columns per epoch and the --print_every steps' loss, accuracy, LR and input wait, at global
iterations; a resume continues the same curves from its checkpoint's iteration, and what the
stopped run wrote past it is purged; a full log folder, at the start or mid-run, is one line as for
the run log."""

from __future__ import annotations

import glob
import os

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.support.trainer_runs import fill_up, one_error_line, run_trainer

STEPS = 4  # 32 records at a batch of 8
SYNTHETIC = ["--train_data", "null", "--epoch_size", "64", "--num_epochs", "1"]
EPOCH_TAGS = {
    "epoch/loss": "loss",
    "epoch/accuracy": "accuracy",
    "epoch/test_accuracy": "test_accuracy",
    "epoch/test_top5_accuracy": "top5_test_accuracy",
    "epoch/learning_rate": "learning_rate",
    "epoch/images_per_sec": "inputs_per_sec",
}
STEP_TAGS = ("train/loss", "train/accuracy", "train/learning_rate", "train/input_wait_share")


def scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    (run,) = glob.glob(os.path.join(log_dir, "tensorboard", "resnet50_model_*"))
    events = EventAccumulator(run)
    events.Reload()
    return {
        tag: [(event.step, event.value) for event in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


def rows_of(log_dir) -> list[dict]:
    rows = []
    for path in sorted(glob.glob(os.path.join(log_dir, "resnet50_*.log"))):
        with open(path) as log:
            lines = [line for line in log if not line.startswith("#")]
        header = lines[0].strip().split(",")
        rows += [dict(zip(header, line.strip().split(","))) for line in lines[1:]]
    return rows


@pytest.fixture
def first_run(image_db, tmp_path):
    train = image_db("train", 32, 4)
    logs = tmp_path / "logs"
    common = ["--train_data", train, "--test_data", train, "--print_every", "2", "--log_top5"]
    done = run_trainer(
        *common,
        "--tensorboard",
        "--num_epochs",
        "2",
        "--keep_checkpoints",
        "2",
        "--log_dir",
        str(logs),
        "--checkpoint_dir",
        str(tmp_path / "first"),
    )
    assert done.returncode == 0, done.stderr
    return common, logs, tmp_path


def test_the_event_files_hold_the_logs_columns_and_the_printed_steps(first_run):
    _, logs, _ = first_run
    read = scalars(logs)
    rows = rows_of(logs)
    for tag, column in EPOCH_TAGS.items():
        assert [step for step, _ in read[tag]] == [STEPS, 2 * STEPS], tag
        for (_, value), row in zip(read[tag], rows):
            assert value == pytest.approx(float(row[column]), rel=1e-5), tag
    for tag in STEP_TAGS:
        assert [step for step, _ in read[tag]] == [2, 4, 6, 8], tag
    assert read["train/learning_rate"][0][1] == pytest.approx(0.1 * 8 / 256)
    assert all(0 <= share <= 1 for _, share in read["train/input_wait_share"])


def test_a_resume_continues_the_curves_from_its_checkpoint(first_run):
    """Resumed from epoch 1 of 2: epoch 2's points of the first run are replaced, not doubled."""
    common, logs, tmp_path = first_run
    before = scalars(logs)
    done = run_trainer(
        *common,
        "--tensorboard",
        "--num_epochs",
        "3",
        "--load_model_path",
        str(tmp_path / "first" / "resnet50_model_1.pt"),
        "--log_dir",
        str(logs),
        "--checkpoint_dir",
        str(tmp_path / "second"),
    )
    assert done.returncode == 0, done.stderr
    read = scalars(logs)
    assert [step for step, _ in read["epoch/loss"]] == [STEPS, 2 * STEPS, 3 * STEPS]
    assert [step for step, _ in read["train/loss"]] == [2, 4, 6, 8, 10, 12]
    assert read["epoch/loss"][0] == before["epoch/loss"][0]
    resumed_rows = rows_of(logs)[2:]  # the second run's log: epochs 2 and 3
    for (_, value), row in zip(read["epoch/loss"][1:], resumed_rows):
        assert value == pytest.approx(float(row["loss"]), rel=1e-5)


def test_without_the_flag_nothing_is_written(image_db, tmp_path):
    train = image_db("train", 16, 4)
    done = run_trainer("--train_data", train, "--num_epochs", "1", "--log_dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert not os.path.exists(tmp_path / "tensorboard")


def test_a_refused_event_directory_leaves_no_run_log(image_db, tmp_path):
    """<log_dir>/tensorboard is a file: one line naming it, exit 2, and neither a run log of a
    header alone nor a checkpoint left behind."""
    train = image_db("train", 16, 4)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "tensorboard").write_text("not a directory")
    done = run_trainer(
        "--train_data", train, "--num_epochs", "1", "--log_dir", str(logs), "--tensorboard"
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "--tensorboard cannot write its event files in" in line, line
    assert os.listdir(logs) == ["tensorboard"]


def test_a_full_log_folder_at_the_start_is_one_line_and_leaves_nothing(tmpfs, tmp_path):
    """Room for the run log but not for the event file: one line, no traceback of TensorBoard's
    writer thread, and neither an empty event file nor its folders left."""
    logs = tmpfs("logs", "64k")
    fill_up(logs, leave_bytes=4096)
    done = run_trainer(
        *SYNTHETIC, "--log_dir", logs, "--checkpoint_dir", str(tmp_path), "--tensorboard"
    )
    assert done.returncode == 2, done.stderr
    assert f"--tensorboard cannot write its event files in {logs}/tensorboard/" in one_error_line(
        done.stderr
    )
    assert "(No space left on device)" in done.stderr
    assert os.listdir(logs) == ["filler"]


def test_a_log_folder_that_fills_mid_run_stops_the_run_at_the_epochs_end(tmpfs, tmp_path):
    """The event file outgrows its last free page at a --print_every step: the run stops at the
    epoch's end, once its checkpoint is saved, in one line as a full run log does; the points
    written before the failure are whole and readable."""
    logs = tmpfs("logs", "64k")
    fill_up(logs, leave_bytes=2 * 4096)  # a page for the run log, one for the event file
    done = run_trainer(
        *SYNTHETIC,
        *("--batch_size", "2", "--epoch_size", "128", "--print_every", "1"),
        *("--log_dir", logs, "--checkpoint_dir", str(tmp_path), "--tensorboard"),
    )
    assert done.returncode == 2, done.stderr
    line = one_error_line(done.stderr)
    assert "error: writing TensorBoard's event file " in line, line
    assert line.endswith(
        "failed (No space left on device): free space in --log_dir or choose another; the "
        "points already written are intact"
    ), line
    assert os.path.exists(tmp_path / "resnet50_model_1.pt")
    steps = [step for step, _ in scalars(logs)["train/loss"]]
    assert steps == list(range(1, len(steps) + 1)) and 1 < len(steps) < 64, steps
