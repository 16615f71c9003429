"""--dtype bfloat16 in a real run on the CPU: it trains, and the log says so."""

from __future__ import annotations

import glob
import math
import os

import torch

from resnet50_trainer import cli
from resnet50_trainer.checkpoint import files as checkpoint_files
from tests.support.trainer_runs import SMALL_RUN

TINY = [*SMALL_RUN, "--num_epochs", "1"]


def test_bfloat16_run_on_cpu_trains_and_logs(image_db, tmp_path):
    db = image_db("train", 16, 4)
    status = cli.main(
        [
            "--train_data",
            db,
            "--test_data",
            image_db("test", 8, 4),
            "--dtype",
            "bfloat16",
            "--log_dir",
            str(tmp_path),
            *TINY,
        ]
    )
    assert status == 0
    [log_path] = glob.glob(str(tmp_path / "resnet50_gpu1_b8_L4_*.log"))
    with open(log_path) as log_file:
        row = log_file.read().splitlines()[2].split(",")
    assert int(row[2]) == 16 and math.isfinite(float(row[9]))  # input_count, loss
    saved = checkpoint_files.load_checkpoint(
        os.path.join(tmp_path, "resnet50_model_1.pt"), "resnet50_model"
    )
    assert saved["arguments"]["dtype"] == "bfloat16"
    assert saved["model"]["fc.weight"].dtype == torch.float32  # autocast keeps float32 weights
    assert saved["scaler"] == {}  # no scaler without float16
