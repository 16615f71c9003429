"""The EMA of the weights: its update against the formula, its checkpoint state and how a resume
reads it; and exact resume with every regularisation flag on, for real (2 CPU processes): a run
resumed mid-epoch ends with the very weights and EMA of the uninterrupted run (see
tests/system/test_resume.py for why no tolerance is needed)."""

from __future__ import annotations

import re
import shutil

import pytest
import torch
import torchvision

from resnet50_trainer.checkpoint import schema
from resnet50_trainer.model.ema import WeightsEma, restore_ema
from resnet50_trainer.model.resnet import build_model
from tests.support.dbfactory import write_image_db
from tests.support.trainer_runs import log_rows, one_error_line, run_trainer

DECAY = 0.9
# --recipe modern: cosine LR after a warm-up, label smoothing, mixup, cutmix, no BN weight decay,
# random-resized crops, FixRes test sizes and an EMA, here one that moves within 3 short epochs.
EVERYTHING = [
    *("--recipe", "modern", "--warmup_epochs", "1"),
    *("--ema_decay", str(DECAY), "--ema_steps", "2", "--ema_for_test"),
]


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(18, 4, 3)


def _train_a_little(model: torch.nn.Module, seed: int) -> None:
    """New weights and new batch-norm statistics."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter))
    model.train()(torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(seed)))


def test_the_average_is_the_formula_every_n_iterations_buffers_included():
    model = _model(0)
    ema = WeightsEma(model, DECAY, every=2)
    _train_a_little(model, 1)
    ema.update(model, 1)  # not a multiple of 2: no update
    assert ema.state()["updates"] == 0
    ema.update(model, 2)  # the first update copies
    first = {name: tensor.clone() for name, tensor in ema.module.state_dict().items()}
    assert all(torch.equal(first[name], t) for name, t in model.state_dict().items())
    _train_a_little(model, 2)
    ema.update(model, 4)
    assert ema.state()["updates"] == 2
    for name, tensor in model.state_dict().items():
        if tensor.is_floating_point():  # weights, BN's running mean and variance
            expected = DECAY * first[name] + (1 - DECAY) * tensor
            assert torch.allclose(ema.module.state_dict()[name], expected, atol=1e-6), name
    running_mean = ema.module.state_dict()["bn1.running_mean"]
    assert not torch.equal(running_mean, first["bn1.running_mean"])


def test_its_state_round_trips_bitwise_through_a_file(tmp_path):
    model = _model(0)
    ema = WeightsEma(model, DECAY, every=1)
    for step in (1, 2, 3):
        _train_a_little(model, step)
        ema.update(model, step)
    torch.save(ema.state(), tmp_path / "ema.pt")
    restored = WeightsEma(_model(5), DECAY, every=1)
    restored.load(torch.load(tmp_path / "ema.pt", weights_only=True))
    assert restored.state()["updates"] == 3
    for name, tensor in ema.module.state_dict().items():
        assert torch.equal(restored.module.state_dict()[name], tensor), name


def test_a_checkpoint_without_an_ema_starts_it_from_the_resumed_weights():
    model, ema = _model(0), WeightsEma(_model(1), DECAY, every=1)
    restore_ema(ema, None, model, "x.pt", warn=False)
    assert ema.state()["updates"] == 0
    assert all(torch.equal(ema.module.state_dict()[n], t) for n, t in model.state_dict().items())
    restore_ema(None, ema.state(), model, "x.pt", warn=False)  # dropped: nothing to load into


@pytest.mark.parametrize(
    "ema, named",
    [
        ({"model": 3, "updates": 1}, "an EMA that is not weights"),
        ({"model": {}, "updates": -1}, "an EMA that is not weights"),
        ({"model": {}, "updates": True}, "an EMA that is not weights"),
        ({"model": {"w": 1.0}, "updates": 1}, "not named tensors"),
        ({"model": {"w": torch.tensor([float("nan")])}, "updates": 1}, "EMA w"),
    ],
)
def test_a_malformed_ema_in_a_checkpoint_is_named(ema, named):
    model = _model(0)
    state = {"model": model.state_dict(), "optimizer": {}, "epoch_sums": None, "step": 0}
    problem = schema.field_problem({**state, "ema": ema})
    assert problem is not None and named in problem


@pytest.fixture(scope="module")
def uninterrupted(module_tmp_path):
    """3 epochs of 4 steps with everything on, a checkpoint every 3 iterations, all kept."""
    root = module_tmp_path
    train, test = (
        write_image_db(str(root / "train"), 32, 4),
        write_image_db(str(root / "test"), 16, 4),
    )
    out = root / "uninterrupted"
    three_epochs(train, test, out, "--checkpoint_every_iters", "3", "--keep_checkpoints", "10")
    return train, test, out


def three_epochs(train: str, test: str, out, *args: str):
    done = run_trainer(
        *("--train_data", train, "--test_data", test, "--num_gpus", "2", "--num_epochs", "3"),
        *("--log_dir", str(out), *EVERYTHING, *args),
    )
    assert done.returncode == 0, done.stderr
    return done


# Iteration 6 (epoch 2, step 2) and 9 (epoch 3, step 1): the EMA, updated every 2 iterations,
# is resumed in and out of step with its updates.
@pytest.mark.parametrize("resumed_from", ["resnet50_model_1_step2.pt", "resnet50_model_2_step1.pt"])
def test_a_mid_epoch_resume_ends_with_the_same_weights_and_ema(
    uninterrupted, resumed_from, tmp_path
):
    train, test, out = uninterrupted
    three_epochs(train, test, tmp_path, "--load_model_path", str(out / resumed_from))
    expected = torch.load(out / "resnet50_model_3.pt", weights_only=True)
    resumed = torch.load(tmp_path / "resnet50_model_3.pt", weights_only=True)
    assert resumed["ema"]["updates"] == expected["ema"]["updates"] == 6
    for part in (expected["model"], expected["ema"]["model"]):
        other = resumed["model"] if part is expected["model"] else resumed["ema"]["model"]
        assert part.keys() == other.keys()
        for name in part:
            assert torch.equal(part[name], other[name]), name
    assert not torch.equal(expected["model"]["fc.weight"], expected["ema"]["model"]["fc.weight"])
    # Every epoch the resumed run logs, its LR (the cosine's, after the warm-up) included.
    reference = {row["epoch"]: row for row in log_rows(out)}
    assert len({row["learning_rate"] for row in reference.values()}) == 3  # it moves every epoch
    for row in log_rows(tmp_path):
        for column in ("learning_rate", "loss", "accuracy", "test_accuracy"):
            assert row[column] == reference[row["epoch"]][column], (row["epoch"], column)


def test_the_log_and_test_only_score_the_ema(uninterrupted, tmp_path):
    """--ema_for_test: the log's test_accuracy is the EMA's of the console, and --test_only
    scores the checkpoint's EMA to the same value (one average on every process)."""
    train, test, out = uninterrupted
    final = out / "resnet50_model_3.pt"
    scored = run_trainer(
        *("--train_data", "null", "--test_data", test, "--num_gpus", "2", "--test_only"),
        *("--load_model_path", str(final), "--ema_for_test"),
    )
    assert scored.returncode == 0, scored.stderr
    found = re.search(r"Test accuracy ([0-9.]+) of .*'s EMA", scored.stderr)
    assert found, scored.stderr
    test_only = float(found[1])
    assert test_only == float(log_rows(out)[2]["test_accuracy"])

    bare = tmp_path / "no_ema.pt"
    shutil.copy(final, bare)
    state = torch.load(bare, weights_only=True)
    torch.save({**state, "ema": None}, bare)
    refused = run_trainer(
        *("--train_data", "null", "--test_data", test, "--test_only"),
        *("--load_model_path", str(bare), "--ema_for_test"),
    )
    assert refused.returncode == 2
    assert "holds none (its run had no --ema_decay)" in one_error_line(refused.stderr)


def test_a_resume_keeps_no_bn_weight_decay(uninterrupted, tmp_path):
    train, _, out = uninterrupted
    refused = run_trainer(
        *("--train_data", train, "--num_epochs", "4", "--log_dir", str(tmp_path)),
        *("--load_model_path", str(out / "resnet50_model_3.pt")),
    )
    assert refused.returncode == 2
    assert "was made with --no_bn_weight_decay True, this run has False" in one_error_line(
        refused.stderr
    )


def test_the_checkpoint_s_ema_loads_into_torchvision_s_resnet(uninterrupted):
    _, _, out = uninterrupted
    ema = torch.load(out / "resnet50_model_3.pt", weights_only=True)["ema"]["model"]
    torchvision.models.resnet18(num_classes=4).load_state_dict(ema, strict=True)
