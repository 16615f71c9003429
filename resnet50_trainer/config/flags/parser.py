"""The trainer's parser, from the flags each group's dataclass declares once (declare.py): data,
images and the input pipeline (images.py), devices (devices.py), model, optimisation and the
learning rate (optimisation.py), regularisation (regularisation.py), machines (distributed.py),
logs and checkpoints (outputs.py); the settings' checks against each other are config/checks.py.
A flag's name is its Config field's (config/settings.py), but where its declaration names it."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from resnet50_trainer.config.flags.declare import add_flag_group, flag_groups
from resnet50_trainer.config.parsing import FlagHelpFormatter, OneLineParser, add_version_flag
from resnet50_trainer.config.settings import Config
from resnet50_trainer.errors import TRAINER

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")  # it names Redis keys and files
# The groups in the order --help shows them: Config's fields' order.
FLAG_GROUPS = flag_groups(Config)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=TRAINER,
        description="Train ResNet-50 (or 18/34/101/152/200, or a ResNeXt) with PyTorch "
        "DistributedDataParallel from an LMDB or LevelDB image database of Caffe Datum or "
        "Caffe2 TensorProtos records. "
        "Flags follow Caffe2's resnet50_trainer.py. A switch such as --use_cpu may also be "
        "given a value, as the original's were: true or false (or 1/0, yes/no, any case).",
        formatter_class=FlagHelpFormatter,
    )
    add_version_flag(parser)
    for flags in FLAG_GROUPS:
        add_flag_group(parser, flags)
    return parser


def flag_actions() -> dict[str, argparse.Action]:
    """The trainer's flags by setting name (argparse dest): their types, choices and defaults."""
    return {action.dest: action for action in build_parser()._actions}


def given_flags(argv: Sequence[str] | None) -> set[str]:
    """The settings (argparse dests) the command line gives itself, which neither a --recipe nor
    a --solver file overrides."""
    parser = build_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))
