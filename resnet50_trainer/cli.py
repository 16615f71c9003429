"""The resnet50-trainer command: the flags parsed (config/flags/), the run's Config built from them
(config/build.py), checked against this machine (launch/probes.py), the run launched
(launch/processes.py, which imports torch only once the flags hold)."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from typing import NoReturn

from resnet50_trainer.commands import run_command
from resnet50_trainer.config.build import build_config, with_recipe_and_solver
from resnet50_trainer.config.flags.parser import build_parser
from resnet50_trainer.config.launchers import Launched, detect_launcher
from resnet50_trainer.config.settings import Config
from resnet50_trainer.errors import TRAINER
from resnet50_trainer.launch.probes import check_machine, check_torch_loads, gpus_on_this_machine
from resnet50_trainer.lifecycle import leave
from resnet50_trainer.streams import guard_standard_streams, log_lines

__all__ = ["build_parser", "command", "config_from_args", "main", "with_recipe_and_solver"]


def config_from_args(
    args: argparse.Namespace, gpus_present: int, launched: Launched | None = None
) -> Config:
    """The run's settings built from the parsed flags (config/build.py), then checked against
    this machine; UserError on the first problem."""
    config = build_config(args, gpus_present, launched)
    check_machine(config)
    return config


def command() -> NoReturn:
    """The resnet50-trainer command (and `python -m resnet50_trainer`): main(), then leave."""
    leave(main())


def main(argv: Sequence[str] | None = None) -> int:
    guard_standard_streams(TRAINER)  # --help and a refused flag write too
    log_lines(logging.INFO)
    args = build_parser().parse_args(argv)
    return run_command(TRAINER, lambda: _build_and_launch(args, argv))


def _build_and_launch(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    """The run's Config built from the flags (--recipe and --solver beneath them, a launcher's
    placement adopted) and checked; the run launched, its exit status returned."""
    check_torch_loads()
    launched = detect_launcher(os.environ)
    args, lines = with_recipe_and_solver(args, argv, launched)
    config = config_from_args(args, 0 if args.use_cpu else gpus_on_this_machine(), launched)
    from resnet50_trainer.launch.processes import launch  # torch: only once the flags hold

    return launch(config, launched, lines)  # which says what the lines set once inputs hold


if __name__ == "__main__":
    command()
