"""`resnet50-db`: make, inspect and dump the image databases the trainer reads.

Each subcommand lives in its own module: HELP (its line in the list of subcommands), DESCRIPTION
(atop its --help) and `register(parser)`, which adds its arguments to its parser and sets `run` (a
function of the parsed arguments returning the exit status); add one to SUBCOMMANDS.
"""

from __future__ import annotations

import argparse
import logging

from resnet50_trainer.commands import run_command
from resnet50_trainer.config.parsing import OneLineParser, add_version_flag
from resnet50_trainer.streams import guard_standard_streams, log_lines
from resnet50_trainer.tools.db import bench, copy, create, dump, inspect

SUBCOMMANDS = {"create": create, "copy": copy, "inspect": inspect, "dump": dump, "bench": bench}


def build_parser() -> argparse.ArgumentParser:
    # Its subcommands' parsers are of its class too: every refusal one line.
    parser = OneLineParser(
        prog="resnet50-db",
        description="Create, copy, inspect and dump LMDB/LevelDB databases of Caffe Datum or "
        "Caffe2 TensorProtos image records.",
    )
    add_version_flag(parser)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, subcommand in SUBCOMMANDS.items():
        subcommand.register(
            subparsers.add_parser(name, help=subcommand.HELP, description=subcommand.DESCRIPTION)
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    guard_standard_streams("resnet50-db")  # --help and a refused argument write too
    args = build_parser().parse_args(argv)
    log_lines(logging.INFO)
    return run_command(f"resnet50-db {args.command}", lambda: args.run(args))
