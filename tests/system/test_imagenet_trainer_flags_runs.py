"""The later original's flags (imagenet_trainer.py) in real runs: --test_epoch_size with top-5, a
ResNeXt checkpoint that loads into torchvision and whose plain resume is refused."""

from __future__ import annotations

import glob
import re

import pytest
import torchvision

from resnet50_trainer.reporting.runlog import HEADER, TOP5_COLUMN
from resnet50_trainer.tools.plot.figure import build_figure
from resnet50_trainer.tools.plot.logfile import read_run_log, run_label
from tests.support.trainer_runs import files, model_state, read_log, refused_in_process, run_trainer

# "Epoch 1: ..., test accuracy 0.1250, test top-5 0.7500 over 8 images, ..."
EPOCH_LINE = re.compile(
    r"test accuracy (?P<top1>[0-9.]+), test top-5 (?P<top5>[0-9.]+) over (?P<images>\d+) images"
)


def test_a_run_evaluates_the_first_test_epoch_size_images_with_top5(image_db, tmp_path):
    """Two processes, 10 labels: 8 of the 16 test records are scored (4 each), top-5 >= top-1 on
    the console and in the --log_top5 column, the per-channel values reach the log's first line,
    and resnet50-plot draws the top-5 curve."""
    train, test = image_db("train", 16, 10), image_db("test", 16, 10)
    result = run_trainer(
        *("--train_data", train, "--test_data", test, "--num_labels", "10", "--num_gpus", "2"),
        *("--num_epochs", "1", "--test_epoch_size", "8", "--log_top5", "--log_dir", str(tmp_path)),
        *("--image_mean_per_channel", "104", "117", "123", "--image_std_per_channel", "58,57,57"),
    )
    assert result.returncode == 0, result.stderr
    (epoch_line,) = [line for line in result.stderr.splitlines() if line.startswith("Epoch 1:")]
    scores = EPOCH_LINE.search(epoch_line)
    assert scores, epoch_line
    assert scores["images"] == "8" and float(scores["top5"]) >= float(scores["top1"])
    assert re.search(r"best test accuracy [0-9.]+ \(epoch 1, top-5 [0-9.]+\)", result.stderr)
    path, first_line, rows = read_log(tmp_path)
    assert list(rows[0]) == [*HEADER, TOP5_COLUMN]
    assert float(rows[0][TOP5_COLUMN]) == pytest.approx(float(scores["top5"]), abs=1e-4)
    assert "image_mean_per_channel=[104.0, 117.0, 123.0]" in first_line
    accuracy_axes = build_figure([read_run_log(path)]).axes[1]
    assert TOP5_COLUMN in {line.get_label() for line in accuracy_axes.lines}
    legend = accuracy_axes.get_legend()
    assert legend is not None
    assert "test top-5" in [text.get_text() for text in legend.get_texts()]


def test_resnext_checkpoint_loads_into_torchvision_and_a_plain_resume_is_refused(
    image_db, tmp_path, capsys
):
    train = image_db("train", 16, 4)
    resnext = ("--num_layers", "50", "--resnext_num_groups", "32", "--resnext_width_per_group", "4")
    result = run_trainer(
        "--train_data", train, *resnext, "--num_epochs", "1", "--log_dir", str(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    (log_path,) = glob.glob(str(tmp_path / "resnext50_gpu1_b8_L4_lr0.10_v2_*.log"))
    assert run_label(log_path) == "ResNeXt-50, 1 GPU, batch 8, 4 labels, lr 0.10"
    checkpoint = str(tmp_path / "resnet50_model_1.pt")
    stock = torchvision.models.resnext50_32x4d(num_classes=4)
    stock.load_state_dict(model_state(checkpoint), strict=True)
    before = files(tmp_path)
    line = refused_in_process(
        capsys,
        *("--train_data", train, "--num_layers", "50", "--resnext_width_per_group", "4"),
        *("--num_epochs", "2", "--log_dir", str(tmp_path), "--load_model_path", checkpoint),
    )
    assert "made with --resnext_num_groups 32, this run has 1" in line
    assert files(tmp_path) == before  # refused before anything was written
