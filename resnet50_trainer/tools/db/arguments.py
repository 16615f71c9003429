"""The arguments of a resnet50-db subcommand that opens one database: its path and its type."""

from __future__ import annotations

import argparse

from resnet50_trainer.data.formats.db_types import DB_TYPES, LMDB


def add_subcommand(
    subparsers: argparse._SubParsersAction, name: str, help: str, description: str
) -> argparse.ArgumentParser:
    """The subcommand's parser, with DB (the database's path) and --db_type."""
    parser = subparsers.add_parser(name, help=help, description=description)
    parser.add_argument("db_path", metavar="DB")
    parser.add_argument("--db_type", choices=DB_TYPES, default=LMDB)
    return parser
