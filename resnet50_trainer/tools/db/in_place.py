"""Where a database's build goes: the target checked, the database built under a temporary name
beside it (work_dir.py) and renamed into place complete, its class names in "<DB>.labels.txt"
beside it, so that the database's folder stays clean. An interrupted or failed build (SIGINT,
SIGTERM, a full disk) removes what it built and never leaves a database that looks complete."""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass, field

from resnet50_trainer.data.formats.databases import holds_only_a_database
from resnet50_trainer.errors import UserError
from resnet50_trainer.path_words import check_reachable, shown
from resnet50_trainer.tools.db.sources import CreateOptions
from resnet50_trainer.tools.db.stop_signals import StopOnSignals
from resnet50_trainer.tools.db.work_dir import work_directory


@dataclass
class CreateSummary:
    db_path: str
    written: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    seconds: float = 0.0
    labels_path: str | None = None
    stopped_by: int | None = None  # a signal that came while the finished DB was put in place


def labels_path_for(db_path: str) -> str:
    return os.path.normpath(db_path) + ".labels.txt"


def built_in_place(options: CreateOptions, write) -> CreateSummary:
    """The database `write(build_path, work_dir, summary, check_stop)` writes (returning the path
    of a labels file it wrote in work_dir, or None), built under a temporary name beside the
    target and renamed into place complete; removed on any failure or stop signal."""
    target = target_of(options.db_path)
    _check_target(target, options.overwrite)
    summary = CreateSummary(db_path=target)
    started = time.perf_counter()
    with StopOnSignals().installed() as stop, work_directory(target) as work_dir:
        build_path = os.path.join(work_dir, "db")
        labels = write(build_path, work_dir, summary, stop.check)
        stop.check()  # the last moment to stop: what follows puts the database in place
        _check_target(target, options.overwrite)  # what appeared there meanwhile stays
        _install(build_path, target, work_dir)
        summary.labels_path = _install_labels(labels, target)
    summary.stopped_by = stop.received
    summary.seconds = time.perf_counter() - started
    return summary


def target_of(db_path: str) -> str:
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
            f"cannot be written ({exc.strerror}); {fix_for(exc)}, and run again with --overwrite"
        ) from exc
    return None


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


def fix_for(failed_write: OSError) -> str:
    """What to do about a file that could not be written: room where the disk is full, else the
    folder (it may have been moved or removed meanwhile)."""
    if failed_write.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free some space or choose another path"
    return "check that the folder is still there and writable, or choose another path"
