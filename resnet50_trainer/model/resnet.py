"""torchvision's ResNet with our options: depth, input channels, ResNeXt's groups and width,
weight-decay groups, and the
--model_parallel split of one replica over two devices (optionally pipelined over micro-batches).

Every model built here keeps torchvision's state-dict keys (conv1, bn1, layer1..layer4, fc), so a
checkpoint's weights load into torchvision.models.resnet50(num_classes=n) as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torchvision import models

from resnet50_trainer.config.flags.model import (
    RESNET_GROUPS,
    RESNET_WIDTH_PER_GROUP,
    SUPPORTED_LAYERS,
)
from resnet50_trainer.config.settings import Config

logger = logging.getLogger(__name__)


def _resnet200(weights: None = None, **kwargs) -> models.ResNet:
    """torchvision builds no ResNet-200; the original's depth list (Caffe2's resnet.py) had it,
    as bottlenecks [3, 24, 36, 3]."""
    return models.ResNet(models.resnet.Bottleneck, [3, 24, 36, 3], **kwargs)


# All of these are ResNet v1.5 (stride on the bottleneck's 3x3) with global average pooling.
RESNET_BUILDERS: dict[int, Callable[..., models.ResNet]] = {
    18: models.resnet18,
    34: models.resnet34,
    50: models.resnet50,
    101: models.resnet101,
    152: models.resnet152,
    200: _resnet200,
}

# torchvision's ResNet.forward, as an ordered list of its child modules (flatten comes before fc).
STAGE_ORDER = (
    "conv1",
    "bn1",
    "relu",
    "maxpool",
    "layer1",
    "layer2",
    "layer3",
    "layer4",
    "avgpool",
    "fc",
)
SPLIT_POINTS = ("layer1", "layer2", "layer3", "layer4")

# The default split balances forward FLOPs (not measured time) of the two halves. FLOPs per stage
# for one 224x224 image, GFLOPs (2 per multiply-add), by torch.utils.flop_counter.FlopCounterMode:
#   depth  stem   layer1 layer2 layer3 layer4 head | first|second half when split at layer3
#   18     0.236  0.925  0.822  0.822  0.822  0.001 | 1.98 | 1.65
#   34     0.236  1.387  1.747  2.672  1.285  0.001 | 3.37 | 3.96
#   50     0.236  1.336  2.055  2.929  1.618  0.004 | 3.63 | 4.55
#   101    0.236  1.336  2.055 10.353  1.618  0.004 | 3.63 | 11.98
#   152    0.236  1.336  3.802 16.031  1.618  0.004 | 5.37 | 17.65
#   200    0.236  1.336 10.790 16.031  1.618  0.004 | 12.36 | 17.65
# At stage granularity layer3 is the most even boundary for every depth (backward costs ~2x
# forward per stage, so the same boundary balances a training step).
DEFAULT_SPLIT_AT = "layer3"


def build_model(
    num_layers: int,
    num_labels: int,
    num_channels: int,
    groups: int = RESNET_GROUPS,
    width_per_group: int = RESNET_WIDTH_PER_GROUP,
) -> models.ResNet:
    """Return torchvision's resnet{num_layers} with random weights, num_labels outputs and
    num_channels input channels (conv1 rebuilt when it is not 3, keeping its key and init). With
    groups and width_per_group, torchvision's ResNeXt of that depth (32 and 4 at 50 layers:
    resnext50_32x4d)."""
    if num_layers not in RESNET_BUILDERS:
        raise ValueError(f"num_layers must be one of {SUPPORTED_LAYERS}, got {num_layers}")
    model = RESNET_BUILDERS[num_layers](
        weights=None, num_classes=num_labels, groups=groups, width_per_group=width_per_group
    )
    if num_channels != 3:
        stock = model.conv1
        model.conv1 = nn.Conv2d(
            num_channels,
            stock.out_channels,
            kernel_size=stock.kernel_size,
            stride=stock.stride,
            padding=stock.padding,
            bias=False,
        )
        # The same initialisation torchvision gives every conv of a ResNet.
        nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")
    return model


@dataclass(frozen=True)
class Architecture:
    """The network a run trains: --num_layers, --num_labels, --num_channels, ResNeXt's flags."""

    num_layers: int
    num_labels: int
    num_channels: int
    groups: int = RESNET_GROUPS
    width_per_group: int = RESNET_WIDTH_PER_GROUP

    @classmethod
    def of(cls, config: Config) -> Architecture:
        return cls(
            config.num_layers,
            config.num_labels,
            config.num_channels,
            config.resnext_num_groups,
            config.resnext_width_per_group,
        )


def model_for(architecture: Architecture) -> models.ResNet:
    return build_model(
        architecture.num_layers,
        architecture.num_labels,
        architecture.num_channels,
        architecture.groups,
        architecture.width_per_group,
    )


def model_shapes(config: Config) -> models.ResNet:
    """This run's model on the meta device, to check weights against: shapes only, nothing is
    allocated or initialised for real."""
    with torch.device("meta"):
        return model_for(Architecture.of(config))


def weight_decay_groups(model: nn.Module, bn_weight_decay: bool = True) -> list[dict]:
    """Split the parameters into two SGD parameter groups, as the original did: weight decay on
    conv weights, the fc weight and BN scales; none on biases (BN shifts and the fc bias). Without
    `bn_weight_decay` (--no_bn_weight_decay) none on BN scales either, as torchvision's reference
    recipe for ResNet-50 trains.

    The first group carries no "weight_decay" key, so it takes the optimizer's weight_decay; the
    second sets it to 0.0. Use:
    torch.optim.SGD(weight_decay_groups(model), lr=..., weight_decay=wd).
    Works on a plain ResNet, a SplitResNet, or either wrapped in DistributedDataParallel.
    """
    # _BatchNorm: BatchNorm1d/2d/3d and SyncBatchNorm alike.
    batch_norm = {
        id(parameter)
        for module in model.modules()
        if not bn_weight_decay and isinstance(module, nn.modules.batchnorm._BatchNorm)
        for parameter in module.parameters(recurse=False)
    }
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, parameter in model.named_parameters():
        exempt = name.endswith("bias") or id(parameter) in batch_norm
        (no_decay if exempt else decay).append(parameter)
    return [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]


def with_batch_norm_synced(model: nn.Module, sync: bool) -> nn.Module:
    """--sync_bn: every BatchNorm made a SyncBatchNorm, whose training statistics are those of the
    global batch (all processes'), before DDP wraps the model; the same state-dict keys."""
    return nn.SyncBatchNorm.convert_sync_batchnorm(model) if sync else model


class SplitResNet(nn.Module):
    """One ResNet replica over two devices: the stages before split_at on devices[0], split_at
    and everything after it (fc included) on devices[1].

    It holds the very submodules of the given model under their own names, so its state-dict keys
    are torchvision's, and building it moves those submodules (the given model is changed in
    place). Do not call .to(device)/.cuda() on it afterwards: that would put both halves on one
    device. Changing only dtype or memory format (.to(memory_format=torch.channels_last)) is fine.

    forward takes images on any device and returns logits on output_device (put the labels there).
    For DistributedDataParallel wrap it with device_ids=None (a multi-device module).

    pipeline_chunks K > 1 splits the batch into K micro-batches and issues them GPipe-style, so the
    first device works on micro-batch i+1 while the second works on micro-batch i. In eval mode the
    result equals K=1. In train mode BatchNorm normalises each micro-batch with its own statistics
    (and updates its running statistics K times), so outputs and gradients differ from K=1.
    """

    def __init__(
        self,
        model: models.ResNet,
        devices: tuple[torch.device, torch.device],
        split_at: str = DEFAULT_SPLIT_AT,
        pipeline_chunks: int = 1,
    ) -> None:
        super().__init__()
        if split_at not in SPLIT_POINTS:
            raise ValueError(f"split_at must be one of {SPLIT_POINTS}, got {split_at!r}")
        if pipeline_chunks < 1:
            raise ValueError(f"pipeline_chunks must be at least 1, got {pipeline_chunks}")
        cut = STAGE_ORDER.index(split_at)
        self._halves = (STAGE_ORDER[:cut], STAGE_ORDER[cut:])
        self.devices = (torch.device(devices[0]), torch.device(devices[1]))
        self.pipeline_chunks = pipeline_chunks
        for half, device in zip(self._halves, self.devices):
            for name in half:
                setattr(self, name, getattr(model, name).to(device))
        logger.info(
            "model split at %s: first half on %s, second half on %s", split_at, *self.devices
        )

    @property
    def output_device(self) -> torch.device:
        return self.devices[1]

    def _run_half(self, index: int, activations: torch.Tensor) -> torch.Tensor:
        activations = activations.to(self.devices[index])
        for name in self._halves[index]:
            if name == "fc":
                activations = torch.flatten(activations, 1)
            activations = getattr(self, name)(activations)
        return activations

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        micro_batches = images.chunk(self.pipeline_chunks)
        # Kernels launch asynchronously on CUDA, so issuing micro-batch i+1's first half before
        # micro-batch i's second half keeps both devices busy at once.
        logits = []
        in_flight = self._run_half(0, micro_batches[0])
        for micro_batch in micro_batches[1:]:
            next_in_flight = self._run_half(0, micro_batch)
            logits.append(self._run_half(1, in_flight))
            in_flight = next_in_flight
        logits.append(self._run_half(1, in_flight))
        return logits[0] if len(logits) == 1 else torch.cat(logits)


def build_split_model(
    num_layers: int,
    num_labels: int,
    num_channels: int,
    devices: tuple[torch.device, torch.device],
    pipeline_chunks: int = 1,
    groups: int = RESNET_GROUPS,
    width_per_group: int = RESNET_WIDTH_PER_GROUP,
) -> SplitResNet:
    """build_model, split at DEFAULT_SPLIT_AT over the two devices (a ResNeXt splits at the same
    stage: grouping changes the convolutions inside a stage, not the stages)."""
    return SplitResNet(
        build_model(num_layers, num_labels, num_channels, groups, width_per_group),
        devices,
        DEFAULT_SPLIT_AT,
        pipeline_chunks,
    )
