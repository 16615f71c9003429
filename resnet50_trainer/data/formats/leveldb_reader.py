"""The LevelDB reader, which reads through a private snapshot of the database.

LevelDB lets only one process open a database, even for reading, and opening it rewrites files
(it replays and rotates the log, writes a new MANIFEST and may compact). So no reader ever opens
the original directory: each one opens a private snapshot, a temporary directory holding copies
of the small metadata files and symbolic links to the table files (*.ldb / *.sst). LevelDB never
modifies an existing table file; whatever it rewrites, renames or deletes in the snapshot touches
only the copies and the links. Any number of processes can thus read one LevelDB at once, and
reading never changes it. The snapshot is removed on close, or when its process exits."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator

import plyvel

from resnet50_trainer import cpython_private
from resnet50_trainer.data.formats.db_reader import Database
from resnet50_trainer.data.formats.db_types import LEVELDB
from resnet50_trainer.errors import UserError
from resnet50_trainer.path_words import denied, shown

_TABLE_SUFFIXES = (".ldb", ".sst")
_METADATA_PREFIXES = ("CURRENT", "MANIFEST-")


def _make_leveldb_snapshot(path: str) -> str:
    source = os.path.abspath(path)
    try:
        names = os.listdir(source)
    except PermissionError:
        raise UserError(f"cannot open LevelDB {shown(path)}: {denied('read', source)}") from None
    snapshot = None
    try:
        snapshot = tempfile.mkdtemp(prefix="resnet50-leveldb-")
        for name in names:
            original = os.path.join(source, name)
            if name.endswith(_TABLE_SUFFIXES):
                os.symlink(original, os.path.join(snapshot, name))
            elif _copied(name):
                shutil.copy2(original, os.path.join(snapshot, name))
    except OSError as error:
        if snapshot is not None:
            shutil.rmtree(snapshot, ignore_errors=True)
        if isinstance(error, PermissionError) and str(error.filename).startswith(source):
            raise UserError(
                f"cannot open LevelDB {shown(path)}: {denied('read', error.filename)}"
            ) from None
        raise _snapshot_refused(path, error.strerror or str(error)) from error
    return snapshot


def _copied(name: str) -> bool:
    """Whether a snapshot holds a copy of the LevelDB's file `name` (else a link, or nothing)."""
    return name.startswith(_METADATA_PREFIXES) or name.endswith(".log")


# What the temporary folder's file system says when it has no room for a snapshot.
_NO_ROOM = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))


def _snapshot_refused(path: str, reason: str) -> UserError:
    """The temporary folder cannot take the snapshot of the LevelDB at `path` (full, read-only)."""
    copies = sum(os.path.getsize(entry.path) for entry in os.scandir(path) if _copied(entry.name))
    return UserError(
        f"cannot open LevelDB {shown(path)}: the temporary folder "
        f"{shown(tempfile.gettempdir())} cannot take its snapshot ({reason}; a reader opens a "
        f"LevelDB through a snapshot there: copies of its small files, {copies / 1024:.1f} KB "
        "here, links to its tables and the few files LevelDB adds): free space there or point "
        "TMPDIR at a folder with room"
    )


def _close_leveldb(db: plyvel.DB, snapshot: str, owner_pid: int) -> None:
    # A forked child inherits this object; only the process that made the snapshot removes it.
    if os.getpid() == owner_pid:
        db.close()
        shutil.rmtree(snapshot, ignore_errors=True)


class LevelDbDatabase(Database):
    def __init__(self, path: str) -> None:
        super().__init__(path, LEVELDB)
        self._snapshot = _make_leveldb_snapshot(path)
        try:
            self._db = plyvel.DB(self._snapshot, create_if_missing=False)
        except plyvel.Error as exc:
            shutil.rmtree(self._snapshot, ignore_errors=True)
            said = self._said(exc)
            if said.endswith(_NO_ROOM):  # LevelDB's own writes as it opens the snapshot
                raise _snapshot_refused(path, said.rsplit(": ", 1)[-1]) from exc
            raise self._unopenable(exc) from exc
        # multiprocessing's Finalize, not weakref.finalize: input processes end with os._exit,
        # which skips atexit, but they run multiprocessing's exit finalizers first.
        self._finalizer = cpython_private.finalize_at_multiprocessing_exit(
            self, _close_leveldb, args=(self._db, self._snapshot, os.getpid()), exitpriority=0
        )

    _READ_ERRORS = (plyvel.Error,)  # a damaged or truncated table file

    def _said(self, error: Exception) -> str:
        said = error.args[0] if error.args else ""  # plyvel says it in bytes
        text = said.decode(errors="replace") if isinstance(said, bytes) else str(error)
        return text.replace(self._snapshot, self.path)  # its files, not their links

    def _read_keys(self) -> list[bytes]:
        with self._reading():
            return list(self._db.iterator(include_value=False))

    def _lookup(self, key: bytes) -> bytes | None:
        with self._reading():
            return self._db.get(key)

    def items(self) -> Iterator[tuple[bytes, bytes | memoryview]]:
        with self._reading():
            yield from self._db.iterator()

    def prefetch(self, keys: Iterable[bytes]) -> None:
        """Nothing: LevelDB reads a record's block itself, in one request (its table files are
        mapped with the kernel's read-ahead), and tells nobody where the block lies."""

    def close(self) -> None:
        self._finalizer()
