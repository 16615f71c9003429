"""`resnet50-db copy`: a database's records into a new one, under the same keys: to another
backend (LMDB <-> LevelDB), or with `--restart_markers` their JPEGs rewritten losslessly with a
restart marker after every MCU, which the trainer's decoder uses to decode only a crop's part
(docs/data.md); or with `--shuffle` in a random order, under keys numbered in it, for a DB in
label order that is read in quasi-random order. The copy is built beside the target and put in
place only when complete."""

from __future__ import annotations

import argparse
from functools import partial

from resnet50_trainer.config.values import BUILD_WORKERS, path_value
from resnet50_trainer.data.formats.databases import detect_db_type
from resnet50_trainer.data.formats.db_types import DB_TYPES, LMDB
from resnet50_trainer.path_words import shown
from resnet50_trainer.tools.db.arguments import add_order_flags, shuffle_seed
from resnet50_trainer.tools.db.build import copy_database
from resnet50_trainer.tools.db.create import refuse_markers_without_region_decoder, run_build
from resnet50_trainer.tools.db.in_place import CreateSummary
from resnet50_trainer.tools.db.sources import CreateOptions

HELP = "copy a database, to the other backend or with restart markers in its JPEGs"
DESCRIPTION = (
    "SOURCE is an LMDB or LevelDB directory; its records are written to DB under the same keys "
    "(with --shuffle: in a random order, each key prefixed with its place in it), their other "
    "fields unchanged."
)


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="SOURCE", type=path_value)
    parser.add_argument("db_path", metavar="DB", type=path_value)
    parser.add_argument("--db_type", choices=DB_TYPES, help="the copy's (default: SOURCE's)")
    parser.add_argument(
        "--restart_markers",
        action="store_true",
        help="rewrite JPEGs losslessly with a restart marker after every MCU (as create's)",
    )
    add_order_flags(parser)
    parser.add_argument("--num_workers", type=BUILD_WORKERS, default=1, help="rewriting processes")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing DB")
    parser.set_defaults(run=lambda args: run(args.source, options_from_args(parser, args)))


def options_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> CreateOptions:
    refuse_markers_without_region_decoder(parser, args)
    db_type = args.db_type or detect_db_type(args.source) or LMDB
    return CreateOptions(
        db_path=args.db_path,
        db_type=db_type,
        restart_markers=args.restart_markers,
        shuffle=args.shuffle,
        seed=shuffle_seed(parser, args),
        num_workers=args.num_workers,
        overwrite=args.overwrite,
    )


def run(source: str, options: CreateOptions) -> int:
    return run_build("resnet50-db copy", "copy", options, partial(copy_database, source), _report)


def _report(summary: CreateSummary, options: CreateOptions) -> None:
    rewritten = ", JPEGs with restart markers" if options.restart_markers else ""
    rewritten += f", shuffled (seed {options.seed})" if options.shuffle else ""
    print(
        f"copied {summary.written} records to {shown(summary.db_path)} "
        f"({options.db_type}{rewritten}) in {summary.seconds:.1f} s"
    )
    if summary.labels_path:
        print(f"labels: {summary.labels_path}")
