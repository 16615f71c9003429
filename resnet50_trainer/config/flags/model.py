"""The model flags: depth and ResNeXt's groups and width; and their check. Part of the one parser
(parser.py)."""

from __future__ import annotations

import argparse

from resnet50_trainer.config.settings import (
    BASIC_BLOCK_LAYERS,
    RESNET_GROUPS,
    RESNET_WIDTH_PER_GROUP,
    SUPPORTED_LAYERS,
    Config,
)
from resnet50_trainer.config.values import (
    Number,
)
from resnet50_trainer.errors import UserError

RESNEXT_GROUPS = Number(int, 1, 1024)


RESNEXT_WIDTH = Number(int, 1, 4096)


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    model.add_argument(
        "--num_layers", type=Number(int), default=50, choices=SUPPORTED_LAYERS, help="ResNet depth"
    )
    model.add_argument(
        "--resnext_num_groups",
        type=RESNEXT_GROUPS,
        default=RESNET_GROUPS,
        help="groups of the bottlenecks' 3x3 convolutions: with --resnext_width_per_group, "
        "a ResNeXt (32 and 4 at 50 layers: ResNeXt-50 32x4d)",
    )
    model.add_argument(
        "--resnext_width_per_group",
        type=RESNEXT_WIDTH,
        default=RESNET_WIDTH_PER_GROUP,
        help="channels per group of the bottlenecks' 3x3 convolutions at the first stage",
    )


def check_model(config: Config) -> None:
    if config.resnext and config.num_layers in BASIC_BLOCK_LAYERS:
        raise UserError(
            f"--resnext_num_groups and --resnext_width_per_group change bottleneck blocks, "
            f"and ResNet-{config.num_layers} has none: use --num_layers 50, 101, 152 or 200, "
            "or leave them at 1 and 64"
        )
