"""--model_parallel end to end on CPU: each replica split in two (both halves on the CPU), DDP over
the composite module across 2 processes, checkpoints that load into an unsplit torchvision model."""

from __future__ import annotations

import torch
import torchvision

from tests.support.trainer_runs import read_log, run_trainer


def test_split_replicas_train_and_checkpoint_like_unsplit_ones(image_db, tmp_path):
    train = image_db("train", 32, 4)
    result = run_trainer(
        *("--train_data", train, "--model_parallel", "--num_gpus", "2", "--pipeline_chunks", "2"),
        *("--num_epochs", "1", "--log_dir", str(tmp_path)),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    _, _, rows = read_log(tmp_path)
    assert int(rows[0]["input_count"]) == 32
    assert "Parameters identical on all 2 processes" in result.stderr
    state = torch.load(tmp_path / "resnet50_model_1.pt", weights_only=True)
    torchvision.models.resnet18(num_classes=4).load_state_dict(state["model"])  # same keys
