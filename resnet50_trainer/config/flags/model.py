"""The model flags: depth and ResNeXt's groups and width. Checked in checks.py. Part of the one
parser (parser.py)."""

from __future__ import annotations

from resnet50_trainer.config.flags.declare import FlagGroup, flag, flag_group
from resnet50_trainer.config.values import (
    Number,
)

# ResNet depths: torchvision's builders (model/resnet.py), named here so the command line needs
# no torch.
SUPPORTED_LAYERS = (18, 34, 50, 101, 152, 200)
# Depths built of basic blocks, which torchvision makes only with 1 group of width 64.
BASIC_BLOCK_LAYERS = (18, 34)
# --resnext_num_groups and --resnext_width_per_group at these values: a plain ResNet.
RESNET_GROUPS = 1
RESNET_WIDTH_PER_GROUP = 64

RESNEXT_GROUPS = Number(int, 1, 1024)


RESNEXT_WIDTH = Number(int, 1, 4096)


@flag_group
class ModelFlags(FlagGroup):
    TITLE = "model"

    num_layers: int = flag(type=Number(int), if_absent=50, choices=SUPPORTED_LAYERS)
    """ResNet depth"""
    resnext_num_groups: int = flag(type=RESNEXT_GROUPS, if_absent=RESNET_GROUPS)
    """groups of the bottlenecks' 3x3 convolutions: with --resnext_width_per_group, a ResNeXt (32
    and 4 at 50 layers: ResNeXt-50 32x4d)"""
    resnext_width_per_group: int = flag(type=RESNEXT_WIDTH, if_absent=RESNET_WIDTH_PER_GROUP)
    """channels per group of the bottlenecks' 3x3 convolutions at the first stage"""
