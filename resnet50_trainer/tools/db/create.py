"""`resnet50-db create`: its flags, checked; the database built (build.py); what was written
reported, or why it stopped."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import fields

from resnet50_trainer.commands import current_folder_gone
from resnet50_trainer.config.values import BUILD_WORKERS, path_value
from resnet50_trainer.data.formats.db_types import DB_TYPES, LMDB
from resnet50_trainer.data.formats.jpeg_region import REGION_DECODE
from resnet50_trainer.data.formats.records import DATUM, RECORD_FORMATS
from resnet50_trainer.path_words import shown
from resnet50_trainer.tools.db.arguments import add_order_flags, shuffle_seed
from resnet50_trainer.tools.db.build import create_database
from resnet50_trainer.tools.db.in_place import CreateSummary
from resnet50_trainer.tools.db.sources import CreateOptions
from resnet50_trainer.tools.db.stop_signals import CreateInterrupted

HELP = "build an LMDB/LevelDB of Datum or TensorProtos records from images"
DESCRIPTION = (
    "SOURCE is a folder with one subfolder per class (labels 0.. in sorted order, written to "
    "DB.labels.txt), or use --list_file and --root."
)


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", metavar="SOURCE", type=path_value)
    parser.add_argument("db_path", metavar="DB", type=path_value)
    parser.add_argument(
        "--list_file", type=path_value, help="convert_imageset list: 'relative/path label' lines"
    )
    parser.add_argument(
        "--root",
        type=path_value,
        help="folder the list file's paths are under (default: the current folder)",
    )
    parser.add_argument("--db_type", choices=DB_TYPES, default=LMDB)
    parser.add_argument("--format", dest="record_format", choices=RECORD_FORMATS, default=DATUM)
    storage = parser.add_mutually_exclusive_group()
    storage.add_argument(
        "--encoded",
        dest="encoded",
        action="store_true",
        default=True,
        help="store image files (default; kept as they are unless resized)",
    )
    storage.add_argument(
        "--raw",
        dest="encoded",
        action="store_false",
        help="store decoded BGR pixels, as Caffe/Caffe2 do",
    )
    parser.add_argument("--resize_height", type=int, default=0)
    parser.add_argument("--resize_width", type=int, default=0)
    parser.add_argument(
        "--shorter_side",
        type=int,
        default=0,
        help="resize so the shorter side is N, keeping the aspect ratio",
    )
    parser.add_argument("--encode_type", choices=("jpg", "png"))
    parser.add_argument("--quality", type=int, default=95, help="JPEG quality, 1..100")
    parser.add_argument("--gray", action="store_true", help="store one-channel images")
    add_order_flags(parser)
    parser.add_argument("--num_workers", type=BUILD_WORKERS, default=1, help="decoding processes")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing DB")
    parser.add_argument(
        "--restart_markers",
        action="store_true",
        help="rewrite JPEGs losslessly with a restart marker after every MCU (same pixels, about "
        "2%% larger for photographs): the trainer then decodes only a crop's part of each "
        "(docs/data.md)",
    )
    parser.set_defaults(run=lambda args: run(options_from_args(parser, args)))


# The options that are a flag's value as given (resize and shorter_side are made from flags).
_FLAG_OPTIONS = {option.name for option in fields(CreateOptions)} - {
    "resize",
    "shorter_side",
    "batch_size",
}


def options_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> CreateOptions:
    if (args.source is None) == (args.list_file is None):
        parser.error("give either SOURCE (class folders) or --list_file, not both or neither")
    if (args.resize_height > 0) != (args.resize_width > 0):
        parser.error("--resize_height and --resize_width go together")
    if args.resize_height > 0 and args.shorter_side > 0:
        parser.error("--shorter_side and --resize_height/--resize_width exclude each other")
    if min(args.resize_height, args.resize_width, args.shorter_side) < 0:
        parser.error("resize sizes must be positive")
    if not 1 <= args.quality <= 100:
        parser.error("--quality must be within 1..100")
    if args.restart_markers and not args.encoded:
        parser.error("--restart_markers rewrites JPEG files: --raw stores none; leave one out")
    if args.restart_markers and args.encode_type == "png":
        parser.error("--restart_markers rewrites JPEG files: --encode_type png makes none")
    refuse_markers_without_region_decoder(parser, args)
    given = {name: value for name, value in vars(args).items() if name in _FLAG_OPTIONS}
    given["seed"] = shuffle_seed(parser, args)
    if args.list_file is not None and args.root is None and current_folder_gone():
        parser.error(
            "--list_file's paths are under --root, the current folder where it is not given, "
            "which no longer exists (removed after the shell entered it): give --root"
        )
    given["root"] = args.root or ""
    return CreateOptions(
        **given,
        resize=(args.resize_width, args.resize_height) if args.resize_height else None,
        shorter_side=args.shorter_side or None,
    )


def refuse_markers_without_region_decoder(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> None:
    """--restart_markers (create's and copy's) rewrites JPEGs with the compiled module."""
    if args.restart_markers and not REGION_DECODE:
        parser.error(
            "--restart_markers needs the compiled region decoder, which this installation lacks "
            "(no compiler or libjpeg headers when it was installed): run scripts/setup.sh"
        )


def run(options: CreateOptions) -> int:
    return run_build("resnet50-db create", "database", options, create_database, _report)


def _report(summary: CreateSummary, options: CreateOptions) -> None:
    rate = summary.written / summary.seconds if summary.seconds else 0.0
    print(
        f"wrote {summary.written} records to {shown(summary.db_path)} ({options.db_type}, "
        f"{options.record_format}, {'encoded' if options.encoded else 'raw'}) "
        f"in {summary.seconds:.1f} s, {rate:.0f} records/s"
    )
    if summary.skipped:
        print(f"skipped {len(summary.skipped)} files (named above)")
    if summary.labels_path:
        print(f"labels: {summary.labels_path}")


def run_build(
    command: str,
    what: str,
    options: CreateOptions,
    build: Callable[[CreateOptions], CreateSummary],
    report: Callable[[CreateSummary, CreateOptions], None],
) -> int:
    """build(options), reported; a stop signal before the database is in place removes it
    (exit 128 + the signal), one after it leaves it in place and says so."""
    try:
        summary = build(options)
    except CreateInterrupted as stop:
        print(
            f"{command}: error: stopped by {stop}; removed the partial {what}, nothing was "
            f"written to {os.path.normpath(options.db_path)}",
            file=sys.stderr,
        )
        return 128 + stop.signum
    report(summary, options)
    if summary.stopped_by is not None:
        print(
            f"{command}: stopped by {signal.Signals(summary.stopped_by).name} once the {what} "
            "was complete; it is in place",
            file=sys.stderr,
        )
        return 128 + summary.stopped_by
    return 0
