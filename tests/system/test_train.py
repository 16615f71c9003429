"""End to end: the command line trains on CPU processes (Gloo), writes the log and checkpoints."""

from __future__ import annotations

import os

import pytest
import torch
import torchvision

from resnet50_trainer.reporting.runlog import HEADER
from tests.support.trainer_runs import REPOSITORY, read_log, run_trainer

SAMPLE = os.path.join(REPOSITORY, "sample_data")


@pytest.mark.parametrize("db_type", ["lmdb", "leveldb"])
def test_two_cpu_processes_train_and_resume(image_db, tmp_path, db_type):
    train = image_db("train", 48, 4, db_type)
    test = image_db("test", 10, 4, db_type)
    common = [
        "--train_data",
        train,
        "--test_data",
        test,
        "--db_type",
        db_type,
        "--num_gpus",
        "2",
        "--num_workers",
        "1",  # one input process each: the DBs are read where they are in real runs
        "--log_dir",
        str(tmp_path),
    ]
    result = run_trainer(*common, "--num_epochs", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    path, first_line, rows = read_log(tmp_path)
    assert os.path.basename(path).startswith("resnet50_gpu2_b8_L4_lr0.10_v2_")
    assert first_line.startswith("# Namespace(")
    assert list(rows[0]) == HEADER and len(rows) == 1
    row = rows[0]
    assert (int(row["input_count"]), int(row["cumulative_batch_count"]), int(row["epoch"])) == (
        48,
        6,
        1,
    )
    assert 0 <= float(row["test_accuracy"]) <= 1
    assert float(row["learning_rate"]) == pytest.approx(0.1 * 8 / 256)
    assert "Finished iteration 6/6 of epoch 1" in result.stderr + result.stdout
    checkpoint = tmp_path / "resnet50_model_1.pt"
    state = torch.load(checkpoint, weights_only=True)
    torchvision.models.resnet18(num_classes=4).load_state_dict(state["model"])  # no module. prefix

    os.unlink(path)
    resumed = run_trainer(
        *common, "--num_epochs", "2", "--load_model_path", str(checkpoint), cwd=tmp_path
    )
    assert resumed.returncode == 0, resumed.stderr
    _, _, rows = read_log(tmp_path)
    assert [int(row["epoch"]) for row in rows] == [2]
    assert int(rows[0]["cumulative_batch_count"]) == 12
    assert sorted(os.listdir(tmp_path)).count("resnet50_model_2.pt") == 1
    assert not checkpoint.exists()  # the previous checkpoint is removed, as the original did


def test_synthetic_data_without_test_data(tmp_path):
    result = run_trainer(
        *("--train_data", "null", "--batch_size", "4", "--epoch_size", "8", "--num_labels", "10"),
        *("--num_epochs", "1", "--log_dir", str(tmp_path)),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    _, _, rows = read_log(tmp_path)
    assert rows[0]["test_accuracy"] == "-1" and int(rows[0]["input_count"]) == 8


@pytest.mark.skipif(not os.path.isdir(os.path.join(SAMPLE, "train_lmdb")), reason="no sample_data")
def test_resnet50_on_sample_data_two_processes(tmp_path):
    result = run_trainer(
        *("--train_data", os.path.join(SAMPLE, "train_lmdb")),
        *("--test_data", os.path.join(SAMPLE, "test_lmdb")),
        *("--num_layers", "50", "--num_workers", "1", "--num_gpus", "2", "--batch_size", "16"),
        *("--num_labels", "10", "--epoch_size", "160", "--num_epochs", "1"),
        *("--log_dir", str(tmp_path)),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    _, _, rows = read_log(tmp_path)
    assert int(rows[0]["input_count"]) == 160 and float(rows[0]["test_accuracy"]) >= 0
