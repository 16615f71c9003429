"""The folder a database is built in (`.DB.partial-*`, beside the target DB, so that the finished
one is renamed into place on one filesystem): removed when its build ends, however it ends in
Python. A build killed outright (SIGKILL, the kernel's OOM killer, a crash) cannot remove its own:
a build holds an flock on its folder, which the kernel drops with the process, and the next build
of the same target removes the folders nobody holds."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

# A folder younger than this may be one whose build has made it but not yet locked it.
_UNLOCKED_FOR_S = 60.0


@contextmanager
def work_directory(target: str) -> Iterator[str]:
    """A new folder beside `target`, held until the block ends and then removed; the folders of
    builds of `target` that were killed are removed first."""
    parent, name = os.path.split(os.path.abspath(target))
    prefix = f".{name}.partial-"
    _remove_abandoned(parent, prefix)
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    held = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):  # no flock on folders there (NFS): never swept
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        os.close(held)  # after the removal: no other build removes it meanwhile


def _remove_abandoned(parent: str, prefix: str) -> None:
    with os.scandir(parent) as entries:
        folders = [
            entry.path
            for entry in entries
            if entry.name.startswith(prefix) and entry.is_dir(follow_symlinks=False)
        ]
    for folder in folders:
        held = _held_if_abandoned(folder)
        if held is None:
            continue
        try:
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            os.close(held)
        log.info("removed %s, left by a build that was killed", folder)


def _held_if_abandoned(folder: str) -> int | None:
    """A descriptor holding `folder`'s lock where no live build holds it; None where one does or
    may (a folder younger than _UNLOCKED_FOR_S)."""
    try:
        held = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if time.time() - os.fstat(held).st_mtime > _UNLOCKED_FOR_S:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return held
    except OSError:
        pass  # its build lives
    os.close(held)
    return None
