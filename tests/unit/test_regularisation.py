"""Label smoothing, MixUp and CutMix, no weight decay on batch norm, SyncBatchNorm: the formulas
against torchvision's own transforms, draws that are a function of their position alone, the
flags' refusals, and the conversion to SyncBatchNorm (a step with it needs a GPU)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from resnet50_trainer.errors import UserError
from resnet50_trainer.model.resnet import build_model, weight_decay_groups, with_batch_norm_synced
from resnet50_trainer.train.batch_mixing import (
    BatchMixing,
    MixDraw,
    cutmix_draw,
    mix_images,
    mix_targets,
)
from tests.support.trainer_runs import config_of, refused_in_process, run_trainer

NUM_LABELS = 5
HEIGHT, WIDTH = 40, 48  # not square: a box's x and y must not be swapped


def _batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (6, 3, HEIGHT, WIDTH), dtype=torch.uint8, generator=generator)
    return images, torch.randint(0, NUM_LABELS, (6,), generator=generator)


def _beta(alpha: float) -> float:
    """torchvision's draw of the share, from torch's global generator."""
    return float(torch.distributions.Beta(torch.tensor([alpha]), torch.tensor([alpha])).sample(()))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("alpha", [0.2, 1.0])
def test_mixup_is_torchvision_s(seed, alpha):
    images, labels = _batch(seed)
    torch.manual_seed(seed)
    expected_images, expected_targets = v2.MixUp(alpha=alpha, num_classes=NUM_LABELS)(
        images.float(), labels
    )
    torch.manual_seed(seed)  # the same draw, taken here
    share = _beta(alpha)
    assert torch.equal(mix_images(images, MixDraw(share, None)), expected_images)
    assert torch.equal(mix_targets(labels, share, NUM_LABELS), expected_targets)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("alpha", [0.2, 1.0])
def test_cutmix_is_torchvision_s(seed, alpha):
    images, labels = _batch(seed)
    torch.manual_seed(seed)
    expected_images, expected_targets = v2.CutMix(alpha=alpha, num_classes=NUM_LABELS)(
        images, labels
    )
    torch.manual_seed(seed)  # torchvision draws the share, then the box's centre x, then y
    share = _beta(alpha)
    centre_x, centre_y = int(torch.randint(WIDTH, (1,))), int(torch.randint(HEIGHT, (1,)))
    draw = cutmix_draw(share, centre_x, centre_y, WIDTH, HEIGHT)
    assert torch.equal(mix_images(images, draw), expected_images)
    assert torch.equal(mix_targets(labels, draw.share, NUM_LABELS), expected_targets)


def test_a_cutmix_share_is_the_area_left_to_the_image():
    assert cutmix_draw(1.0, 10, 10, WIDTH, HEIGHT) == MixDraw(1.0, (10, 10, 10, 10))
    # share 0: a box of the image's size around the centre, clipped at the edges.
    draw = cutmix_draw(0.0, 0, HEIGHT - 1, WIDTH, HEIGHT)
    assert draw.box == (0, HEIGHT - 1 - HEIGHT // 2, WIDTH // 2, HEIGHT)
    x1, y1, x2, y2 = draw.box
    assert draw.share == 1 - (x2 - x1) * (y2 - y1) / (WIDTH * HEIGHT)


def test_the_same_position_draws_the_same_whatever_torch_s_generator():
    mixing = BatchMixing(0.2, 1.0, NUM_LABELS, seed=7, rank=1)
    torch.manual_seed(1)
    first = [mixing.draw(iteration, HEIGHT, WIDTH) for iteration in range(50)]
    torch.manual_seed(2)
    torch.rand(100)
    assert [mixing.draw(iteration, HEIGHT, WIDTH) for iteration in range(50)] == first
    # Another iteration, rank or seed is another draw.
    assert len(set(first)) == 50
    for other in (BatchMixing(0.2, 1.0, NUM_LABELS, 7, 0), BatchMixing(0.2, 1.0, NUM_LABELS, 8, 1)):
        assert all(other.draw(i, HEIGHT, WIDTH) != first[i] for i in range(50))


def test_with_both_on_each_batch_takes_one_of_the_two_half_the_time():
    mixing = BatchMixing(0.2, 1.0, NUM_LABELS, seed=0, rank=0)
    cutmix = sum(mixing.draw(i, HEIGHT, WIDTH).box is not None for i in range(2000))
    assert 900 < cutmix < 1100  # deterministic: the draws are seeded
    only_mixup = BatchMixing(0.2, 0.0, NUM_LABELS, 0, 0)
    only_cutmix = BatchMixing(0.0, 1.0, NUM_LABELS, 0, 0)
    assert all(only_mixup.draw(i, HEIGHT, WIDTH).box is None for i in range(100))
    assert all(only_cutmix.draw(i, HEIGHT, WIDTH).box is not None for i in range(100))


def test_off_the_batch_is_untouched_and_accuracy_counts_the_dominant_label():
    images, labels = _batch()
    off = BatchMixing(0.0, 0.0, NUM_LABELS, 0, 0)(images, labels, 3)
    assert off.images is images and off.targets is labels and off.dominant_labels is labels
    mixing = BatchMixing(0.2, 1.0, NUM_LABELS, 0, 0)
    for iteration in range(40):
        mixed = mixing(images, labels, iteration)
        share = mixing.draw(iteration, HEIGHT, WIDTH).share
        assert torch.equal(mixed.targets.argmax(1), mixed.dominant_labels) or share == 0.5
        own = labels if share >= 0.5 else labels.roll(1, 0)
        assert torch.equal(mixed.dominant_labels, own)


def test_label_smoothing_spreads_a_share_of_every_soft_target():
    logits = torch.randn(6, NUM_LABELS, generator=torch.Generator().manual_seed(0))
    targets = mix_targets(_batch()[1], 0.7, NUM_LABELS)
    smoothed = targets * 0.9 + 0.1 / NUM_LABELS
    expected = -(smoothed * logits.log_softmax(1)).sum(1).mean()
    assert torch.allclose(F.cross_entropy(logits, targets, label_smoothing=0.1), expected)


def test_no_bn_weight_decay_leaves_only_conv_and_fc_weights_decayed():
    model = build_model(18, NUM_LABELS, 3)
    decay, no_decay = weight_decay_groups(model, bn_weight_decay=False)
    weights = {
        id(module.weight)
        for module in model.modules()
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear))
    }
    assert {id(p) for p in decay["params"]} == weights
    assert len(no_decay["params"]) == len(list(model.parameters())) - len(weights)


def test_sync_bn_conversion_keeps_keys_and_weight_decay_groups():
    """On the CPU, the conversion only: a SyncBatchNorm step needs a GPU."""
    model = build_model(18, NUM_LABELS, 3)
    keys, groups = model.state_dict().keys(), weight_decay_groups(model, bn_weight_decay=False)
    synced = with_batch_norm_synced(model, True)
    assert any(isinstance(module, torch.nn.SyncBatchNorm) for module in synced.modules())
    assert synced.state_dict().keys() == keys
    synced_groups = weight_decay_groups(synced, bn_weight_decay=False)
    assert [len(g["params"]) for g in synced_groups] == [len(g["params"]) for g in groups]
    assert with_batch_norm_synced(model, False) is model


@pytest.mark.skipif(not torch.cuda.is_available(), reason="SyncBatchNorm trains on GPUs only")
def test_a_sync_bn_run_trains_on_a_gpu(image_db, tmp_path):
    database = image_db("train", 16, 4)
    done = run_trainer(
        *("--train_data", database, "--use_cpu", "false", "--sync_bn", "--num_epochs", "1"),
        *("--log_dir", str(tmp_path)),
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "flag, value",
    [("--label_smoothing", value) for value in ("nan", "inf", "-0.1", "1", "1.5", "x")]
    + [("--mixup_alpha", value) for value in ("nan", "inf", "-1", "1e7")]
    + [("--cutmix_alpha", value) for value in ("nan", "-inf", "-0.5", "")]
    + [("--ema_decay", value) for value in ("nan", "1", "-0.5", "inf")]
    + [("--ema_steps", value) for value in ("0", "1.5", "-1", "nan")],
)
def test_bad_values_are_refused_in_one_line(flag, value, capsys):
    line = refused_in_process(capsys, "--train_data", "null", flag, value)
    assert f"argument {flag}: invalid value" in line


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--sync_bn"], "--sync_bn with --use_cpu"),
        (["--ema_for_test"], "--ema_for_test scores the EMA"),
        (["--ema_for_test", "--ema_steps", "4"], "add --ema_decay"),
    ],
)
def test_settings_that_contradict_each_other_are_refused(flags, named, capsys):
    assert named in refused_in_process(capsys, "--train_data", "null", *flags)


def test_sync_bn_with_model_parallel_is_refused():
    with pytest.raises(UserError, match="--sync_bn with --model_parallel"):
        config_of("--train_data", "null", "--sync_bn", "--model_parallel", gpus_present=2)


def test_the_defaults_are_off():
    config = config_of("--train_data", "null", "--use_cpu")
    assert (config.label_smoothing, config.mixup_alpha, config.cutmix_alpha) == (0, 0, 0)
    assert (config.ema_decay, config.no_bn_weight_decay, config.sync_bn) == (0, False, False)
