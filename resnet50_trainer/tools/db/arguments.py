"""The arguments shared by resnet50-db subcommands: a database's path and type, for those that open
one; the record order, for those that write one (create, copy)."""

from __future__ import annotations

import argparse

from resnet50_trainer.config.values import SEED, path_value
from resnet50_trainer.data.formats.db_types import DB_TYPES, LMDB


def add_database_arguments(parser: argparse.ArgumentParser) -> None:
    """DB (the database's path) and --db_type, for a subcommand that opens one."""
    parser.add_argument("db_path", metavar="DB", type=path_value)
    parser.add_argument("--db_type", choices=DB_TYPES, default=LMDB)


def add_order_flags(parser: argparse.ArgumentParser) -> None:
    """--shuffle and --seed: the records written in a seeded random order, as convert_imageset's
    --shuffle. A DB in label order read in quasi-random order costs accuracy (docs/data.md)."""
    parser.add_argument(
        "--shuffle",
        action="store_true",
        help="write the records in a random order (keys numbered in it), not in label order",
    )
    parser.add_argument("--seed", type=SEED, help="seed of --shuffle's order (default: 0)")


def shuffle_seed(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """--seed's value, 0 where not given; refused without --shuffle, whose order it seeds."""
    if args.seed is not None and not args.shuffle:
        parser.error("--seed seeds --shuffle's order, and this writes in key order: add --shuffle")
    return args.seed or 0
