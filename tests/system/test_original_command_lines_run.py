"""A command line ported from Caffe2's resnet50_trainer.py in a real run: its learning rate, and a
resume with the default scaling."""

from __future__ import annotations

import os

import pytest

from tests.support.trainer_runs import read_log, run_trainer

SYNTHETIC_EPOCH = ["--train_data", "null", "--epoch_size", "16", "--num_epochs", "1"]
# SMALL_RUN's global batch is 8: the default scaling makes the base LR 0.1 into 0.1 x 8 / 256.
BASE_LR, SCALED_LR = 0.1, 0.1 * 8 / 256


def test_an_original_run_s_learning_rate_and_a_resume_with_the_default_scaling(tmp_path):
    """--use_cpu True trains; --lr_scaling none keeps the base LR in the start line, the log's
    column and its name; a resume with the default scaling warns of the change and scales."""
    log_dir = ["--log_dir", str(tmp_path)]
    original = run_trainer(
        "--use_cpu", "True", *SYNTHETIC_EPOCH, "--lr_scaling", "none", *log_dir, cwd=tmp_path
    )
    assert original.returncode == 0, original.stderr
    assert f"effective LR {BASE_LR:g} (base {BASE_LR:g} as given: --lr_scaling none)" in (
        original.stderr
    )
    path, _, rows = read_log(tmp_path)
    assert os.path.basename(path).startswith("resnet50_gpu1_b8_L4_lr0.10_v2_")  # the base LR
    assert [float(row["learning_rate"]) for row in rows] == [BASE_LR]

    os.unlink(path)
    checkpoint = str(tmp_path / "resnet50_model_1.pt")
    resumed = run_trainer(
        *SYNTHETIC_EPOCH,
        "--num_epochs",
        "2",
        "--load_model_path",
        checkpoint,
        *log_dir,
        cwd=tmp_path,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"effective LR {SCALED_LR:.5g} (base {BASE_LR:g} x 8 / 256)" in resumed.stderr
    assert f"changes on resume from {BASE_LR:g} to {SCALED_LR:.6g}" in resumed.stderr
    assert "--lr_scaling" in resumed.stderr
    path, _, rows = read_log(tmp_path)
    assert os.path.basename(path).startswith("resnet50_gpu1_b8_L4_lr0.10_v2_")
    assert [float(row["learning_rate"]) for row in rows] == [pytest.approx(SCALED_LR)]
