"""The trainer's flags, the original's and ours, each defined once: name, type and valid values,
default, help. Grouped as the help shows them: data, images and the input pipeline, devices
(devices.py), model, optimisation and the learning rate (optimisation.py), regularisation
(regularisation.py), machines (distributed.py), logs and checkpoints.
A flag's name is its Config field's (config/settings.py), but where `dest` says otherwise."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from resnet50_trainer.config.flags.data import add_data_flags, check_data
from resnet50_trainer.config.flags.devices import add_device_flags, check_devices
from resnet50_trainer.config.flags.distributed import add_distributed_flags, check_distributed
from resnet50_trainer.config.flags.images import add_image_flags, check_images
from resnet50_trainer.config.flags.model import add_model_flags, check_model
from resnet50_trainer.config.flags.optimisation import (
    add_learning_rate_flags,
    add_optimisation_flags,
    check_optimisation,
)
from resnet50_trainer.config.flags.outputs import add_output_flags, check_outputs
from resnet50_trainer.config.flags.regularisation import (
    add_regularisation_flags,
    check_regularisation,
)
from resnet50_trainer.config.parsing import FlagHelpFormatter, OneLineParser, add_version_flag
from resnet50_trainer.config.settings import (
    Config,
)
from resnet50_trainer.errors import TRAINER

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")  # it names Redis keys and files
# The groups in the order --help shows them; each group's file holds its flags and their checks.
FLAG_GROUPS = (
    add_data_flags,
    add_image_flags,
    add_device_flags,
    add_model_flags,
    add_optimisation_flags,
    add_learning_rate_flags,
    add_regularisation_flags,
    add_distributed_flags,
    add_output_flags,
)
GROUP_CHECKS = (
    check_data,
    check_devices,
    check_optimisation,
    check_distributed,
    check_images,
    check_model,
    check_outputs,
    check_regularisation,
)


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
    for add_flags in FLAG_GROUPS:
        add_flags(parser)
    return parser


def check_settings(config: Config) -> None:
    """The settings against each other, group by group, with no look at the machine (that is
    launch/probes.py's and launch/preflight.py's); UserError on the first problem. The GPU choice
    and the run id are checked as config/build.py works them out."""
    for check in GROUP_CHECKS:
        check(config)


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
