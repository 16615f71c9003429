"""The model builder, weight-decay groups, the two-device split (on CPU) and DDP over it (Gloo)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch.utils.flop_counter import FlopCounterMode

from resnet50_trainer.config.flags.model import SUPPORTED_LAYERS
from resnet50_trainer.distributed.devices import model_parallel_devices
from resnet50_trainer.errors import UserError
from resnet50_trainer.model.resnet import (
    DEFAULT_SPLIT_AT,
    RESNET_BUILDERS,
    SPLIT_POINTS,
    STAGE_ORDER,
    SplitResNet,
    build_model,
    build_split_model,
    weight_decay_groups,
)
from tests.support.small_models import CPU_PAIR, NUM_LABELS, seeded_batch, seeded_resnet18


# torchvision has no resnet200 to compare with: tests/unit/test_imagenet_trainer_flags.py counts
# its parameters.
@pytest.mark.parametrize("num_layers", [layers for layers in SUPPORTED_LAYERS if layers != 200])
def test_each_depth_builds_with_torchvision_keys(num_layers):
    model = build_model(num_layers, NUM_LABELS, 3).eval()
    stock = getattr(torchvision.models, f"resnet{num_layers}")(num_classes=NUM_LABELS)
    assert list(model.state_dict()) == list(stock.state_dict())
    with torch.no_grad():
        assert model(seeded_batch(size=2)[0]).shape == (2, NUM_LABELS)


def test_unknown_depth_is_refused():
    with pytest.raises(ValueError, match="num_layers"):
        build_model(42, NUM_LABELS, 3)


def test_grayscale_model_runs_and_keeps_keys():
    model = build_model(50, NUM_LABELS, 1)
    assert model.conv1.weight.shape == (64, 1, 7, 7)
    logits = model(seeded_batch(size=2, channels=1)[0])
    assert logits.shape == (2, NUM_LABELS)
    stock_keys = torchvision.models.resnet50(num_classes=NUM_LABELS).state_dict().keys()
    assert model.state_dict().keys() == stock_keys


def test_weights_load_strictly_into_torchvision_resnet50():
    model = build_model(50, NUM_LABELS, 3)
    stock = torchvision.models.resnet50(num_classes=NUM_LABELS)
    stock.load_state_dict(model.state_dict(), strict=True)
    assert torch.equal(stock.fc.weight, model.fc.weight)


def test_weight_decay_on_conv_fc_and_bn_weights_only():
    model = build_model(50, NUM_LABELS, 3)
    decay_group, no_decay_group = weight_decay_groups(model)
    assert "weight_decay" not in decay_group and no_decay_group["weight_decay"] == 0.0
    decay_ids = {id(p) for p in decay_group["params"]}
    no_decay_ids = {id(p) for p in no_decay_group["params"]}
    expected_decay = set()
    for module in model.modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear, torch.nn.BatchNorm2d)):
            expected_decay.add(id(module.weight))
    all_ids = [id(p) for p in model.parameters()]
    assert decay_ids == expected_decay
    assert no_decay_ids == set(all_ids) - expected_decay
    assert id(model.fc.bias) in no_decay_ids and id(model.bn1.bias) in no_decay_ids
    assert len(decay_group["params"]) + len(no_decay_group["params"]) == len(all_ids)


def _stage_forward_flops(model: torchvision.models.ResNet, pixels: int) -> dict:
    activations, flops = torch.randn(1, 3, pixels, pixels), {}
    with torch.no_grad():
        for name in STAGE_ORDER:
            if name == "fc":
                activations = torch.flatten(activations, 1)
            with FlopCounterMode(display=False) as counter:
                activations = getattr(model, name)(activations)
            flops[name] = counter.get_total_flops()
    return flops


@pytest.mark.parametrize("num_layers", SUPPORTED_LAYERS)
def test_default_split_balances_forward_flops(num_layers):
    # 64 px keeps every stage's FLOPs in the same proportion as 224 px (all strides divide both).
    flops = _stage_forward_flops(build_model(num_layers, NUM_LABELS, 3).eval(), 64)

    def imbalance(split_at):
        cut = STAGE_ORDER.index(split_at)
        first = sum(flops[name] for name in STAGE_ORDER[:cut])
        return abs(sum(flops.values()) - 2 * first)

    assert min(SPLIT_POINTS, key=imbalance) == DEFAULT_SPLIT_AT


def test_split_model_matches_unsplit_exactly_in_training():
    # Same device, same kernels in the same order, so outputs and gradients are bitwise equal.
    model = seeded_resnet18()
    reference = copy.deepcopy(model)
    split = SplitResNet(model, CPU_PAIR, split_at="layer2")
    images, labels = seeded_batch()
    split_logits, reference_logits = split(images), reference(images)
    assert torch.equal(split_logits, reference_logits)
    F.cross_entropy(split_logits, labels).backward()
    F.cross_entropy(reference_logits, labels).backward()
    split_grads = dict(split.named_parameters())
    for name, parameter in reference.named_parameters():
        split_grad, grad = split_grads[name].grad, parameter.grad
        assert split_grad is not None and grad is not None and torch.equal(split_grad, grad), name


def test_split_state_dict_round_trips_strictly():
    split = build_split_model(18, NUM_LABELS, 3, CPU_PAIR)
    unsplit = build_model(18, NUM_LABELS, 3)
    unsplit.load_state_dict(split.state_dict(), strict=True)
    again = build_split_model(18, NUM_LABELS, 3, CPU_PAIR)
    again.load_state_dict(unsplit.state_dict(), strict=True)
    for name, tensor in split.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name


def test_split_refuses_unknown_split_point_and_chunks():
    with pytest.raises(ValueError, match="split_at"):
        SplitResNet(seeded_resnet18(), CPU_PAIR, split_at="fc")
    with pytest.raises(ValueError, match="pipeline_chunks"):
        SplitResNet(seeded_resnet18(), CPU_PAIR, pipeline_chunks=0)


@pytest.mark.parametrize("chunks", [2, 4])
def test_pipelined_eval_equals_unpipelined(chunks):
    split = SplitResNet(seeded_resnet18(), CPU_PAIR).eval()
    images, _ = seeded_batch()
    with torch.no_grad():
        whole = split(images)
        split.pipeline_chunks = chunks
        pipelined = split(images)
    # Not bitwise: CPU conv kernels choose their blocking by batch size, so sums may be reordered.
    assert torch.allclose(pipelined, whole, rtol=1e-5, atol=1e-5)


def test_model_parallel_devices_pairs_gpus():
    assert model_parallel_devices([0, 1, 2, 3]) == [
        (torch.device("cuda", 0), torch.device("cuda", 1)),
        (torch.device("cuda", 2), torch.device("cuda", 3)),
    ]


@pytest.mark.parametrize("gpu_ids", [[], [0], [0, 1, 2]])
def test_model_parallel_devices_refuses_unpaired_gpus(gpu_ids):
    with pytest.raises(UserError, match="even number of GPUs") as raised:
        model_parallel_devices(gpu_ids)
    assert "\n" not in str(raised.value)


def test_the_command_line_s_depths_are_torchvision_s_builders():
    assert tuple(sorted(RESNET_BUILDERS)) == SUPPORTED_LAYERS
