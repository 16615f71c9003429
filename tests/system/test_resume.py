"""Exact resume, for real, on CPU with 2 processes: a run of 3 epochs against the same run resumed
from its end-of-epoch-2 checkpoint and from one taken mid-way through epoch 3.

Tolerance: none. The data order and augmentation are functions of (seed, epoch, step, position),
Gloo's all-reduce of 2 processes adds in a fixed order and CPU kernels are deterministic for a
fixed thread count, so the resumed runs' weights are expected to be bitwise equal, and are.
"""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest
import torch

from resnet50_trainer.checkpoint import files as checkpoint_files
from tests.support.dbfactory import write_image_db
from tests.support.trainer_runs import (
    config_of,
    log_rows,
    model_state,
    pause_before_rename,
    run_trainer,
    start_trainer,
    wait_for,
)

# 32 records, global batch 8: 4 steps an epoch. Every 3 iterations a checkpoint: iteration 9 is
# step 1 of epoch 3.
RECORDS, STEPS = 32, 4


@pytest.fixture(scope="module")
def uninterrupted_runs(module_tmp_path):
    """crop -> the reference of that training crop: 3 epochs in one go, every checkpoint kept;
    each run once, when a test first asks for it."""
    root = module_tmp_path
    database = write_image_db(str(root / "db"), RECORDS, 4)
    runs = {}

    def run(crop: str):
        if crop not in runs:
            out = root / f"uninterrupted_{crop}"
            three_epochs_on_two_processes(
                database,
                out,
                *("--checkpoint_every_iters", "3", "--keep_checkpoints", "10", "--crop", crop),
            )
            runs[crop] = database, out
        return runs[crop]

    return run


@pytest.fixture(scope="module")
def uninterrupted(uninterrupted_runs):
    return uninterrupted_runs("scale")


def three_epochs_on_two_processes(database: str, out, *args: str) -> None:
    done = run_trainer(
        *("--train_data", database, "--num_gpus", "2", "--num_epochs", "3", "--log_dir", str(out)),
        *args,
    )
    assert done.returncode == 0, done.stderr


def resume(database: str, checkpoint_path, out, *args: str) -> list[dict]:
    three_epochs_on_two_processes(database, out, "--load_model_path", str(checkpoint_path), *args)
    return log_rows(out)


def assert_same_epoch_3(uninterrupted_out, resumed_out, resumed_rows):
    reference = log_rows(uninterrupted_out)[2]
    row = resumed_rows[-1]
    # The LR, the counters and the loss (which depends on the record order and the crops) agree.
    for column in (
        "epoch",
        "learning_rate",
        "cumulative_batch_count",
        "cumulative_input_count",
        "input_count",
        "loss",
        "accuracy",
    ):
        assert row[column] == reference[column], column
    expected = model_state(uninterrupted_out / "resnet50_model_3.pt")
    resumed = model_state(resumed_out / "resnet50_model_3.pt")
    assert expected.keys() == resumed.keys()
    for name in expected:
        assert torch.equal(expected[name], resumed[name]), name


def test_every_checkpoint_was_kept(uninterrupted):
    _, out = uninterrupted
    saved = [
        (s.epoch, s.step) for s in checkpoint_files.saved_checkpoints(str(out), "resnet50_model")
    ]
    assert saved == [(0, 3), (1, 0), (1, 2), (2, 0), (2, 1), (3, 0)]


def test_resume_after_epoch_2_equals_uninterrupted(uninterrupted, tmp_path):
    database, out = uninterrupted
    rows = resume(database, out / "resnet50_model_2.pt", tmp_path)
    assert len(rows) == 1  # only epoch 3 was trained
    assert_same_epoch_3(out, tmp_path, rows)


@pytest.mark.parametrize("crop", ["scale", "random_resized"])
def test_resume_mid_epoch_equals_uninterrupted(uninterrupted_runs, crop, tmp_path):
    database, out = uninterrupted_runs(crop)
    rows = resume(database, out / "resnet50_model_2_step1.pt", tmp_path, "--crop", crop)
    assert_same_epoch_3(out, tmp_path, rows)


def test_directory_resumes_from_its_newest_complete_checkpoint(uninterrupted, tmp_path):
    _, out = uninterrupted
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    for name in ("resnet50_model_1.pt", "resnet50_model_1_step2.pt"):
        shutil.copy(out / name, directory / name)
    (directory / ".tmp-resnet50_model_2.pt-abc_123.pt").write_bytes(b"cut short")
    state = checkpoint_files.load_checkpoint(str(directory), "resnet50_model")
    assert state["path"] == str(directory / "resnet50_model_1_step2.pt")
    assert (state["epoch"], state["step"], state["iteration"]) == (1, 2, STEPS + 2)


def test_kill_during_checkpoint_write_keeps_the_previous_one(uninterrupted, tmp_path):
    """A writer killed (SIGKILL) between writing and renaming: the previous checkpoint survives,
    and a resume from the directory continues from it."""
    database, out = uninterrupted
    shutil.copy(out / "resnet50_model_1.pt", tmp_path / "resnet50_model_1.pt")
    previous = (tmp_path / "resnet50_model_1.pt").read_bytes()
    resume_here = ["--load_model_path", str(tmp_path), "--log_dir", str(tmp_path)]
    writer = start_trainer(
        "--train_data", database, "--num_epochs", "2", *resume_here, **pause_before_rename(300)
    )
    try:
        wait_for(
            lambda: any(
                name.startswith(".tmp-resnet50_model_2.pt")
                and os.path.getsize(tmp_path / name) > 1_000_000
                for name in os.listdir(tmp_path)
            ),
            180,
            "the checkpoint write",
        )
        time.sleep(1)  # torch.save done or nearly: the pause before the rename holds it here
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait(30)
    finally:
        writer.kill()
        writer.communicate()
    assert not (tmp_path / "resnet50_model_2.pt").exists()
    assert (tmp_path / "resnet50_model_1.pt").read_bytes() == previous
    torch.load(tmp_path / "resnet50_model_1.pt", weights_only=True)  # loads

    done = run_trainer("--train_data", database, "--num_epochs", "2", *resume_here)
    assert done.returncode == 0, done.stderr
    assert "Resumed from " + str(tmp_path / "resnet50_model_1.pt") in done.stderr
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["resnet50_model_2.pt"]  # the run's lock file went with it
        + [n for n in os.listdir(tmp_path) if n.endswith(".log")]
    )


def test_checkpoint_of_2_processes_resumes_on_1(uninterrupted, tmp_path):
    """The same global batch on fewer processes: the record stream and the LR continue as they
    were; the weights differ only because batch norm now sees batches of 8, not 2 x 4."""
    database, out = uninterrupted
    done = run_trainer(
        *("--train_data", database, "--num_gpus", "1", "--num_epochs", "3"),
        *("--log_dir", str(tmp_path), "--load_model_path", str(out / "resnet50_model_2_step1.pt")),
    )
    assert done.returncode == 0, done.stderr
    assert "Checkpoint made with 2 processes, resuming on 1" in done.stderr
    row, reference = log_rows(tmp_path)[-1], log_rows(out)[2]
    for column in ("epoch", "learning_rate", "cumulative_batch_count", "cumulative_input_count"):
        assert row[column] == reference[column], column


def test_a_new_global_batch_continues_from_the_position_reached(caplog):
    from resnet50_trainer.checkpoint.resume import continue_with_global_batch

    def settings(batch):
        argv = ["--train_data", "null", "--use_cpu", "--batch_size", str(batch)]
        return config_of(*argv)

    # Epoch 1 done, 3 steps of 16 into epoch 2: 48 records of the epoch's stream were read.
    state = {"world_size": 1, "global_batch_size": 16, "epoch": 1, "step": 3, "iteration": 13}
    assert continue_with_global_batch(state, settings(16), 1, steps_per_epoch=10) == (3, 13)
    assert continue_with_global_batch(state, settings(8), 1, steps_per_epoch=20) == (6, 26)
    with caplog.at_level("WARNING"):
        assert continue_with_global_batch(state, settings(32), 1, steps_per_epoch=5) == (1, 6)
    assert "16 records of the interrupted step are read again" in caplog.text
