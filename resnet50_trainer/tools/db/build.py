"""Building an LMDB/LevelDB from images (class folders or a convert_imageset list file), or from
another database's records (`copy_database`).

Records are laid out exactly as convert_imageset (Datum) or make_image_db (TensorProtos) write them,
with the same keys ("%08d_" + relative path, the number being the line's position after shuffling),
so those tools' readers read what we write. Each is built beside its target and put in place
complete (in_place.py); a stop signal ends it between records (stop_signals.py).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial

import lmdb
import plyvel
from tqdm import tqdm

from resnet50_trainer.data.formats.databases import detect_db_type, open_database
from resnet50_trainer.data.formats.db_reader import Database
from resnet50_trainer.data.formats.records import serialize_record, with_file_rewritten
from resnet50_trainer.data.formats.writers import check_keys_fit, open_writer
from resnet50_trainer.errors import RecordError, UserError
from resnet50_trainer.limits import shortage_in
from resnet50_trainer.path_words import check_reachable, shown
from resnet50_trainer.tools.db.in_place import (
    CreateSummary,
    built_in_place,
    fix_for,
    labels_path_for,
    target_of,
)
from resnet50_trainer.tools.db.sources import (
    CreateOptions,
    ImageTask,
    build_record,
    place_key,
    read_class_folders,
    read_list_file,
    read_regular_file,
    restart_markers_if_jpeg,
    seeded_order,
    shuffled,
)
from resnet50_trainer.tools.db.stop_signals import process_pool

log = logging.getLogger(__name__)

COPY_CHUNK = 512  # records read from the source at a time: a pool never holds a whole database


def create_database(options: CreateOptions) -> CreateSummary:
    """Build the database described by `options`; UserError for problems the user can fix,
    CreateInterrupted for SIGINT/SIGTERM (the partial database is removed either way)."""

    def write(build_path: str, work_dir: str, summary: CreateSummary, check_stop) -> str | None:
        tasks, class_names = _tasks(options)  # after the target's check, as a user reads them
        _write_records(tasks, options, build_path, summary, check_stop)
        if summary.written == 0:
            raise UserError(
                f"none of the {len(tasks)} images could be read (first: "
                f"{summary.skipped[0][1]}); nothing was written to {shown(summary.db_path)}"
            )
        return _write_labels(work_dir, class_names) if class_names is not None else None

    return built_in_place(options, write)


def copy_database(source: str, options: CreateOptions) -> CreateSummary:
    """`source`'s records, in key order under the same keys, into a new database (or with
    options.shuffle in a seeded random order, each key prefixed with its place in it): as they
    are, or with options.restart_markers each record's JPEG rewritten (restart_markers_if_jpeg),
    every other field of the record kept. A record that is no record is copied as it is."""
    source_type = detect_db_type(source)
    if source_type is None:
        check_reachable("SOURCE", source)
        raise UserError(
            f"{shown(source)} is no LMDB or LevelDB directory; give the database to copy"
        )
    holder = _existing_holder(target_of(options.db_path), source)
    if holder == os.path.realpath(options.db_path):
        raise UserError(f"{shown(source)} is the database to copy: write the copy to another path")
    if holder is not None:
        raise UserError(
            f"{shown(options.db_path)} is inside {shown(source)}, the database to copy: write the "
            "copy to another path"
        )

    def write(build_path: str, work_dir: str, summary: CreateSummary, check_stop) -> str | None:
        # Records are only rewritten with --restart_markers: else no worker has anything to do.
        workers = options.num_workers if options.restart_markers else 1
        with (
            _writing(options, build_path) as writer,
            tqdm(total=len(db), unit="rec", desc="copy", disable=None) as progress,
            process_pool(workers) as mapped,
        ):
            for chunk in _chunks(_in_copy_order(db, options), COPY_CHUNK):
                values = [bytes(value) for _, value in chunk]
                if options.restart_markers:
                    values = list(mapped(_marked_value, values))
                for (key, _), value in zip(chunk, values):
                    check_stop()
                    writer.put(bytes(key), value)
                progress.update(len(chunk))
                summary.written += len(chunk)
        return _copied_labels(source, work_dir)

    with open_database(source, source_type) as db:  # a source it cannot read: nothing made
        keys: Iterable[bytes] = db.keys()
        fix = "copy it to a LevelDB (--db_type leveldb)"
        if options.shuffle:  # places of one width: the longest key is the longest prefixed
            keys = (place_key(0, key, len(db)) for key in db.keys())
            fix += ", or leave out --shuffle, whose place prefix the key is shown with"
        check_keys_fit(keys, options.db_type, fix)
        return built_in_place(options, write)


def _in_copy_order(
    db: Database, options: CreateOptions
) -> Iterator[tuple[bytes, bytes | memoryview]]:
    """(key, value) of each record in key order; with options.shuffle in a seeded random order
    (each value read where it lies), each key prefixed with its place in that order."""
    if not options.shuffle:
        yield from db.items()
        return
    keys = db.keys()
    for place, index in enumerate(seeded_order(len(keys), options.seed)):
        yield place_key(place, keys[index], len(keys)), db.get(keys[index])


def _existing_holder(path: str, directory: str) -> str | None:
    """The nearest of `path`'s ancestors (itself included, links resolved) that is `directory`,
    or None: by device and inode, so that links, ".." and bind mounts are seen through."""
    home = os.stat(directory)
    current = os.path.realpath(path)
    while True:
        try:
            if os.path.samestat(os.stat(current), home):
                return current
        except FileNotFoundError:
            pass  # not made yet: its existing ancestors decide
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def _copied_labels(source: str, work_dir: str) -> str | None:
    """A copy of the source's labels file (create's DB.labels.txt), if it has one, in the work
    directory, to be put beside the copy."""
    labels = labels_path_for(source)
    if not os.path.isfile(labels):
        return None
    copied = os.path.join(work_dir, "labels.txt")
    try:
        shutil.copyfile(labels, copied)
    except OSError as exc:
        raise UserError(
            f"cannot copy {shown(labels)} beside {shown(work_dir)} ({exc.strerror}); "
            f"{fix_for(exc)}; nothing was written"
        ) from exc
    return copied


def _marked_value(value: bytes) -> bytes:
    try:
        return with_file_rewritten(value, restart_markers_if_jpeg)
    except RecordError:
        return value  # no record: copied as it is, for the trainer to count as it did


def _chunks(items, size: int):
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _tasks(options: CreateOptions) -> tuple[list[ImageTask], list[str] | None]:
    if options.list_file is not None:
        tasks, class_names = read_list_file(options.list_file, options.root), None
    else:
        assert options.source is not None, "CreateOptions names a list file or a source folder"
        tasks, class_names = read_class_folders(options.source)
    return (shuffled(tasks, options.seed) if options.shuffle else tasks), class_names


def _write_records(
    tasks: list[ImageTask],
    options: CreateOptions,
    build_path: str,
    summary: CreateSummary,
    check_stop: Callable[[], None],
) -> None:
    check_keys_fit(
        (task.key(len(tasks)) for task in tasks),
        options.db_type,
        "shorten the image's path (a key is its number and its path) or build a LevelDB "
        "(--db_type leveldb)",
    )
    convert = partial(_convert_task, options=options)
    with (
        _writing(options, build_path) as writer,
        tqdm(total=len(tasks), unit="img", desc="create", disable=None) as progress,
        process_pool(options.num_workers) as mapped,
    ):
        for task, outcome in zip(tasks, mapped(convert, tasks)):
            check_stop()
            progress.update()
            if isinstance(outcome, str):
                log.warning("skipped %s: %s", task.path, outcome)
                summary.skipped.append((task.path, outcome))
                continue
            writer.put(task.key(len(tasks)), outcome)
            summary.written += 1


@contextmanager
def _writing(options: CreateOptions, build_path: str):
    """The new database's writer; a full disk or a vanished directory is a UserError. A limit of
    the machine met meanwhile (/dev/shm full as the input processes start) is not the disk's: it
    goes on, to be named as such (commands.run_command)."""
    try:
        with open_writer(build_path, options.db_type, options.batch_size) as writer:
            yield writer
    except (OSError, lmdb.Error, plyvel.Error) as exc:
        if shortage_in(exc) is not None:
            raise
        # LMDB reports a full disk as an I/O error: the free space tells the two apart.
        raise UserError(
            f"cannot write the database beside {options.db_path} "
            f"({getattr(exc, 'strerror', None) or exc}; {_free_space(build_path)} "
            "free there); free some space or choose another path; nothing was "
            "written"
        ) from exc


def _free_space(path: str) -> str:
    try:
        free = shutil.disk_usage(os.path.dirname(path)).free
    except OSError:
        return "unknown space"
    return f"{free / 2**20:.1f} MiB"


def _convert_task(task: ImageTask, options: CreateOptions) -> bytes | str:
    """The serialized record, or the reason the image is skipped."""
    try:
        return serialize_record(build_record(read_regular_file(task.path), task.label, options))
    except OSError as exc:
        return f"cannot read the file ({exc.strerror or exc})"
    except RecordError as exc:
        return f"not a readable image ({exc})"


def _write_labels(work_dir: str, class_names: list[str]) -> str:
    """The labels file, written in the work directory (beside the target, so the final rename
    stays on one filesystem) before anything is put in place."""
    path = os.path.join(work_dir, "labels.txt")
    try:
        # surrogateescape: folder names that are not UTF-8 are written back as their own bytes
        with open(path, "w", encoding="utf-8", errors="surrogateescape") as file:
            file.writelines(f"{label} {name}\n" for label, name in enumerate(class_names))
    except OSError as exc:
        raise UserError(
            f"cannot write the labels file beside {work_dir} ({exc.strerror}); "
            f"{fix_for(exc)}; nothing was written"
        ) from exc
    return path
