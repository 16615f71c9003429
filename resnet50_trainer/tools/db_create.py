"""`resnet50-db create`: images (class folders or a convert_imageset list file) -> LMDB/LevelDB.

Records are laid out exactly as convert_imageset (Datum) or make_image_db (TensorProtos) write them,
with the same keys ("%08d_" + relative path, the number being the line's position after shuffling),
so those tools' readers read what we write. The database is built under a temporary name beside
the target and renamed into place at the end: an interrupted run never leaves a database that looks
complete. Class names go to "<DB>.labels.txt" beside the database, whose directory stays clean.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial

from tqdm import tqdm

from resnet50_trainer.data.databases import DB_TYPES, LMDB, detect_db_type, open_writer
from resnet50_trainer.errors import RecordError, UserError
from resnet50_trainer.data.records import DATUM, RECORD_FORMATS, serialize_record
from resnet50_trainer.tools.db_sources import ImageTask, build_record, read_class_folders, \
    read_list_file, shuffled

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CreateOptions:
    db_path: str
    source: str | None = None  # a folder with one subfolder per class
    list_file: str | None = None  # or convert_imageset's list: "relative/path label" per line
    root: str = ""  # folder the list file's paths are relative to
    db_type: str = LMDB
    record_format: str = DATUM
    encoded: bool = True
    resize: tuple[int, int] | None = None  # (width, height), exact, as convert_imageset
    shorter_side: int | None = None  # keeps the aspect ratio
    encode_type: str | None = None  # "jpg" / "png"; None keeps the file's own format
    quality: int = 95  # JPEG quality when (re-)encoding; OpenCV's default
    gray: bool = False
    shuffle: bool = False
    seed: int = 0
    num_workers: int = 1
    overwrite: bool = False
    batch_size: int = 1000  # records per commit, as both original tools


@dataclass
class CreateSummary:
    db_path: str
    written: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    seconds: float = 0.0
    labels_path: str | None = None


def labels_path_for(db_path: str) -> str:
    return os.path.normpath(db_path) + ".labels.txt"


def create_database(options: CreateOptions) -> CreateSummary:
    """Build the database described by `options`; UserError for problems the user can fix."""
    target = os.path.normpath(options.db_path)
    _check_target(target, options.overwrite)
    if options.list_file is not None:
        tasks, class_names = read_list_file(options.list_file, options.root), None
    else:
        tasks, class_names = read_class_folders(options.source)
    if options.shuffle:
        tasks = shuffled(tasks, options.seed)
    summary = CreateSummary(db_path=target)
    started = time.perf_counter()
    work_dir = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.partial-",
                                dir=os.path.dirname(os.path.abspath(target)))
    try:
        build_path = os.path.join(work_dir, "db")
        _write_records(tasks, options, build_path, summary)
        if summary.written == 0:
            raise UserError(f"none of the {len(tasks)} images could be read (first: "
                            f"{summary.skipped[0][1]}); nothing was written to {target}")
        _install(build_path, target, work_dir)
        if class_names is not None:
            summary.labels_path = _write_labels(target, class_names)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    summary.seconds = time.perf_counter() - started
    return summary


def _check_target(target: str, overwrite: bool) -> None:
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise UserError(f"cannot create {target}: {parent} is not a writable directory; create it "
                        "or choose another path")
    if not os.path.lexists(target):
        return
    if not overwrite:
        raise UserError(f"{target} already exists; pass --overwrite to replace it "
                        "or choose another path")
    if not os.path.isdir(target) or detect_db_type(target) is None:
        raise UserError(f"{target} exists and is not an LMDB/LevelDB directory; refusing to "
                        "overwrite it, choose another path")


def _write_records(tasks: list[ImageTask], options: CreateOptions, build_path: str,
                   summary: CreateSummary) -> None:
    convert = partial(_convert_task, options=options)
    with open_writer(build_path, options.db_type, options.batch_size) as writer, \
            tqdm(total=len(tasks), unit="img", desc="create", disable=None) as progress:
        for task, outcome in _imap(convert, tasks, options.num_workers):
            progress.update()
            if isinstance(outcome, str):
                log.warning("skipped %s: %s", task.path, outcome)
                summary.skipped.append((task.path, outcome))
                continue
            writer.put(task.key.encode("utf-8", "surrogateescape"), outcome)
            summary.written += 1


def _imap(function, tasks: list[ImageTask], num_workers: int):
    """(task, function(task)) in task order, computed by a pool of processes when asked."""
    if num_workers <= 1:
        for task in tasks:
            yield task, function(task)
        return
    with multiprocessing.Pool(num_workers) as pool:
        yield from zip(tasks, pool.imap(function, tasks, chunksize=8))


def _convert_task(task: ImageTask, options: CreateOptions) -> bytes | str:
    """The serialized record, or the reason the image is skipped."""
    try:
        with open(task.path, "rb") as file:
            data = file.read()
        return serialize_record(build_record(data, task.label, options))
    except OSError as exc:
        return f"cannot read the file ({exc.strerror or exc})"
    except RecordError as exc:
        return f"not a readable image ({exc})"


def _install(build_path: str, target: str, work_dir: str) -> None:
    """Rename the finished database into place; an old one is moved aside first."""
    if os.path.lexists(target):
        os.rename(target, os.path.join(work_dir, "replaced"))
    os.rename(build_path, target)


def _write_labels(target: str, class_names: list[str]) -> str:
    path = labels_path_for(target)
    partial_path = path + ".partial"
    with open(partial_path, "w", encoding="utf-8") as file:
        file.writelines(f"{label} {name}\n" for label, name in enumerate(class_names))
    os.replace(partial_path, path)
    return path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "create", help="build an LMDB/LevelDB of Datum or TensorProtos records from images",
        description="SOURCE is a folder with one subfolder per class (labels 0.. in sorted "
                    "order, written to DB.labels.txt), or use --list_file and --root.")
    parser.add_argument("source", nargs="?", metavar="SOURCE")
    parser.add_argument("db_path", metavar="DB")
    parser.add_argument("--list_file", help="convert_imageset list: 'relative/path label' lines")
    parser.add_argument("--root", default="", help="folder the list file's paths are under")
    parser.add_argument("--db_type", choices=DB_TYPES, default=LMDB)
    parser.add_argument("--format", dest="record_format", choices=RECORD_FORMATS, default=DATUM)
    storage = parser.add_mutually_exclusive_group()
    storage.add_argument("--encoded", dest="encoded", action="store_true", default=True,
                         help="store image files (default; kept as they are unless resized)")
    storage.add_argument("--raw", dest="encoded", action="store_false",
                         help="store decoded BGR pixels, as Caffe/Caffe2 do")
    parser.add_argument("--resize_height", type=int, default=0)
    parser.add_argument("--resize_width", type=int, default=0)
    parser.add_argument("--shorter_side", type=int, default=0,
                        help="resize so the shorter side is N, keeping the aspect ratio")
    parser.add_argument("--encode_type", choices=("jpg", "png"))
    parser.add_argument("--quality", type=int, default=95, help="JPEG quality, 1..100")
    parser.add_argument("--gray", action="store_true", help="store one-channel images")
    parser.add_argument("--shuffle", action="store_true")
    parser.add_argument("--seed", type=int, default=0, help="seed of --shuffle")
    parser.add_argument("--num_workers", type=int, default=1, help="decoding processes")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing DB")
    parser.set_defaults(run=lambda args: run(options_from_args(parser, args)))


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
    if args.num_workers < 1:
        parser.error("--num_workers must be at least 1")
    return CreateOptions(
        db_path=args.db_path, source=args.source, list_file=args.list_file, root=args.root,
        db_type=args.db_type, record_format=args.record_format, encoded=args.encoded,
        resize=(args.resize_width, args.resize_height) if args.resize_height else None,
        shorter_side=args.shorter_side or None, encode_type=args.encode_type,
        quality=args.quality, gray=args.gray, shuffle=args.shuffle, seed=args.seed,
        num_workers=args.num_workers, overwrite=args.overwrite)


def run(options: CreateOptions) -> int:
    summary = create_database(options)
    rate = summary.written / summary.seconds if summary.seconds else 0.0
    print(f"wrote {summary.written} records to {summary.db_path} ({options.db_type}, "
          f"{options.record_format}, {'encoded' if options.encoded else 'raw'}) "
          f"in {summary.seconds:.1f} s, {rate:.0f} records/s")
    if summary.skipped:
        print(f"skipped {len(summary.skipped)} files (named above)")
    if summary.labels_path:
        print(f"labels: {summary.labels_path}")
    return 0
