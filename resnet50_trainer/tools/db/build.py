"""Building an LMDB/LevelDB from images (class folders or a convert_imageset list file), or from
another database's records (`copy_database`).

Records are laid out exactly as convert_imageset (Datum) or make_image_db (TensorProtos) write them,
with the same keys ("%08d_" + relative path, the number being the line's position after shuffling),
so those tools' readers read what we write. The database is built under a temporary name beside
the target and renamed into place at the end: an interrupted or failed run (SIGINT, SIGTERM, a full
disk) removes what it built and never leaves a database that looks complete. Class names go to
"<DB>.labels.txt" beside the database, whose directory stays clean.
"""

from __future__ import annotations

import errno
import logging
import multiprocessing
import os
import shutil
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import lmdb
import plyvel
from tqdm import tqdm

from resnet50_trainer.data.formats.databases import (
    detect_db_type,
    holds_only_a_database,
    open_database,
)
from resnet50_trainer.data.formats.db_reader import Database
from resnet50_trainer.data.formats.records import serialize_record, with_file_rewritten
from resnet50_trainer.data.formats.writers import check_keys_fit, open_writer
from resnet50_trainer.errors import RecordError, UserError
from resnet50_trainer.limits import shortage_in
from resnet50_trainer.path_words import check_reachable, shown
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
from resnet50_trainer.tools.db.work_dir import work_directory

log = logging.getLogger(__name__)

# Ctrl-C, a scheduler's or kill's stop, a closed terminal or ssh session, Slurm's early warning.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
COPY_CHUNK = 512  # records read from the source at a time: a pool never holds a whole database


class CreateInterrupted(BaseException):
    """SIGINT or SIGTERM stopped the build; what it had written is removed. A BaseException, as
    KeyboardInterrupt, so that no `except Exception` on the way out swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class CreateSummary:
    db_path: str
    written: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    seconds: float = 0.0
    labels_path: str | None = None
    stopped_by: int | None = None  # a signal that came while the finished DB was put in place


class _StopOnSignals:
    """Records STOP_SIGNALS; the build calls check() between records, which raises
    CreateInterrupted. The handler itself never raises: Python may run it inside code that
    swallows exceptions (an at-fork hook, a finalizer) or that must not be cut short (putting the
    finished database in place, removing the partial one)."""

    def __init__(self) -> None:
        self.received: int | None = None

    def check(self) -> None:
        if self.received is not None:
            raise CreateInterrupted(self.received)

    def _handle(self, signum: int, frame) -> None:
        self.received = self.received or signum

    @contextmanager
    def installed(self) -> Iterator[_StopOnSignals]:
        if threading.current_thread() is not threading.main_thread():
            yield self  # signal handlers belong to the main thread; a caller's thread keeps its own
            return
        previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def labels_path_for(db_path: str) -> str:
    return os.path.normpath(db_path) + ".labels.txt"


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

    return _built_in_place(options, write)


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
    holder = _existing_holder(_target(options.db_path), source)
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
            _process_pool(workers) as mapped,
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
        return _built_in_place(options, write)


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


def _built_in_place(options: CreateOptions, write) -> CreateSummary:
    """The database `write(build_path, work_dir, summary, check_stop)` writes (returning the path
    of a labels file it wrote in work_dir, or None), built under a temporary name beside the
    target and renamed into place complete; removed on any failure or stop signal."""
    target = _target(options.db_path)
    _check_target(target, options.overwrite)
    summary = CreateSummary(db_path=target)
    started = time.perf_counter()
    with _StopOnSignals().installed() as stop, work_directory(target) as work_dir:
        build_path = os.path.join(work_dir, "db")
        labels = write(build_path, work_dir, summary, stop.check)
        stop.check()  # the last moment to stop: what follows puts the database in place
        _check_target(target, options.overwrite)  # what appeared there meanwhile stays
        _install(build_path, target, work_dir)
        summary.labels_path = _install_labels(labels, target)
    summary.stopped_by = stop.received
    summary.seconds = time.perf_counter() - started
    return summary


def _target(db_path: str) -> str:
    """Where the database goes: where `db_path` is a symbolic link, the path it names (the
    database there is the one replaced, and the link stays, as for any file written through a
    link); one line where `db_path` cannot be looked up (a link loop, a folder not to enter)."""
    check_reachable("DB", db_path)
    return os.path.realpath(db_path) if os.path.islink(db_path) else os.path.normpath(db_path)


def _install_labels(labels: str | None, target: str) -> str | None:
    """Put the new labels file beside the database now in place at `target`, or, where the new
    one has none, remove the replaced database's (allowed by --overwrite, see _check_target): a
    labels file never names the classes of another database. Its path, or None."""
    path = labels_path_for(target)
    try:
        if labels is not None:
            os.replace(labels, path)
            return path
        if os.path.lexists(path):
            os.remove(path)
    except OSError as exc:
        raise UserError(
            f"the database is in place at {shown(target)}, but its labels file {shown(path)} "
            f"cannot be written ({exc.strerror}); {_fix_for(exc)}, and run again with --overwrite"
        ) from exc
    return None


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
            f"{_fix_for(exc)}; nothing was written"
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


def _check_target(target: str, overwrite: bool) -> None:
    parent = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        raise UserError(
            f"cannot create {shown(target)}: {shown(parent)} is not a writable directory; create "
            "it or choose another path"
        )
    if os.path.lexists(target):
        if not overwrite:
            raise UserError(
                f"{shown(target)} already exists; pass --overwrite to replace it or choose another "
                "path"
            )
        if not os.path.isdir(target) or not holds_only_a_database(target):
            raise UserError(
                f"{shown(target)} exists and is not an LMDB/LevelDB directory holding nothing "
                "else; refusing to overwrite it, choose another path"
            )
    _check_labels_target(labels_path_for(target), overwrite)


def _check_labels_target(labels: str, overwrite: bool) -> None:
    """The labels file beside the target belongs to the database there (or to one that was):
    replaced only with --overwrite, and only when it is a file."""
    if not os.path.lexists(labels):
        return
    if not stat.S_ISREG(os.lstat(labels).st_mode):
        raise UserError(
            f"{shown(labels)}, where this database's labels file goes, is not a regular file; "
            "refusing to replace it, move it or choose another path"
        )
    if not overwrite:
        raise UserError(
            f"{shown(labels)} already exists (an earlier database's labels); pass --overwrite to "
            "replace it or choose another path"
        )


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
        _process_pool(options.num_workers) as mapped,
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


@contextmanager
def _process_pool(num_workers: int):
    """mapped(function, items): function over a list, in order, computed by a pool of processes
    when asked (stopped at once if the block ends by an exception or a signal)."""
    if num_workers <= 1:
        yield lambda function, items: map(function, items)
        return
    # Forked workers inherit our handlers, which only record a signal: a worker that got the
    # pool's SIGTERM before _worker_signals ran would live on, and the pool's join hang. So they
    # start with SIGINT and SIGTERM blocked, until _worker_signals has set their own.
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    pool = None
    try:
        pool = multiprocessing.Pool(num_workers, initializer=_worker_signals)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        yield lambda function, items: pool.imap(function, items, chunksize=8)
        pool.close()  # all done: the workers exit by themselves
        pool.join()
    finally:
        if pool is not None:
            pool.terminate()  # after an error or a signal: stop them now
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)


def _worker_signals() -> None:
    """Workers leave SIGINT and SIGHUP (sent to the whole terminal group) and SIGUSR1 to the main
    process, which stops them, and die on SIGTERM, which is how the pool stops them."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL if signum == signal.SIGTERM else signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


def _convert_task(task: ImageTask, options: CreateOptions) -> bytes | str:
    """The serialized record, or the reason the image is skipped."""
    try:
        return serialize_record(build_record(read_regular_file(task.path), task.label, options))
    except OSError as exc:
        return f"cannot read the file ({exc.strerror or exc})"
    except RecordError as exc:
        return f"not a readable image ({exc})"


def _install(build_path: str, target: str, work_dir: str) -> None:
    """Rename the finished database into place; an old one is moved aside first, and back if the
    new one cannot take its place (the work directory is removed afterwards)."""
    replaced = os.path.join(work_dir, "replaced")
    try:
        if os.path.lexists(target):
            os.rename(target, replaced)
        os.rename(build_path, target)
    except OSError as exc:
        if os.path.lexists(replaced) and not os.path.lexists(target):
            os.rename(replaced, target)
        raise UserError(
            f"cannot put the new database in place at {shown(target)} ({exc.strerror}); "
            "nothing was changed there"
        ) from exc


def _fix_for(failed_write: OSError) -> str:
    """What to do about a file that could not be written: room where the disk is full, else the
    folder (it may have been moved or removed meanwhile)."""
    if failed_write.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free some space or choose another path"
    return "check that the folder is still there and writable, or choose another path"


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
            f"{_fix_for(exc)}; nothing was written"
        ) from exc
    return path
