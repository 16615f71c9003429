"""The LMDB reader: its environment opened once a process, data.mdb's length and B-tree checked
before LMDB's map is read (lmdb_safety, lmdb_tree), values as views of the map, and prefetch
(lmdb_prefetch)."""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import lmdb

from resnet50_trainer.data.formats import lmdb_safety, lmdb_tree
from resnet50_trainer.data.formats.db_reader import Database
from resnet50_trainer.data.formats.db_types import LMDB
from resnet50_trainer.data.formats.lmdb_prefetch import ValueLocator
from resnet50_trainer.errors import UserError
from resnet50_trainer.path_words import denied, shown

# LMDB refuses to open one environment twice in a process ("already open in this process"), as
# when --test_data is --train_data and both are read in the training process: the readers of a
# process share its one environment, each with its own read transaction. Held weakly, so that it
# closes as it always did, with the last reader that holds it (closed or dropped). Keyed by
# process too: a forked child opens its own (an LMDB environment does not survive a fork).
_OPEN_LMDB: weakref.WeakValueDictionary[tuple[int, int, int], lmdb.Environment] = (
    weakref.WeakValueDictionary()
)


def _open_lmdb(path: str) -> lmdb.Environment:
    info = os.stat(path)
    key = (os.getpid(), info.st_dev, info.st_ino)
    environment = _OPEN_LMDB.get(key)
    if environment is None:
        lock = lmdb_safety.must_register(path)
        # Bytes: py-lmdb encodes a str path as strict UTF-8, which a name the OS took may not be.
        environment = lmdb.open(
            os.fsencode(path), readonly=True, lock=lock, readahead=False, subdir=True
        )
        _OPEN_LMDB[key] = environment
    return environment


# The snapshots (data.mdb's device, inode, size, mtime and the transaction) whose B-tree this
# process or the one that started it has checked: passed on in the environment, so that the
# training processes a launcher spawns (fresh interpreters) do not read the tree again.
_CHECKED_TREES_VARIABLE = "RESNET50_TRAINER_CHECKED_LMDB_TREES"
_CHECKED_TREES_KEPT = 16  # the newest: a run opens two DBs; the variable must stay small


def _tree_checked(snapshot: str) -> bool:
    return snapshot in os.environ.get(_CHECKED_TREES_VARIABLE, "").split()


def _record_tree_checked(snapshot: str) -> None:
    checked = [*os.environ.get(_CHECKED_TREES_VARIABLE, "").split(), snapshot]
    os.environ[_CHECKED_TREES_VARIABLE] = " ".join(checked[-_CHECKED_TREES_KEPT:])


_Value = TypeVar("_Value", bytes, memoryview)  # a transaction's values: copies or views


class LmdbDatabase(Database):
    """Opened without a lock file unless another process has the DB open (lmdb_safety);
    readahead=False: random access over a large file should not pull in neighbouring pages.
    data.mdb's length is checked before each read touches the map (lmdb_safety), and its B-tree
    once a process before LMDB walks it (lmdb_tree)."""

    def __init__(self, path: str) -> None:
        super().__init__(path, LMDB)
        try:
            self._env: lmdb.Environment | None = _open_lmdb(path)
            self._descriptor = os.open(os.path.join(path, "data.mdb"), os.O_RDONLY | os.O_CLOEXEC)
        except (lmdb.Error, OSError) as exc:
            data_file = os.path.join(path, "data.mdb")
            if not os.access(data_file, os.R_OK):
                raise UserError(
                    f"cannot open LMDB {shown(path)}: {denied('read', data_file)}"
                ) from exc
            raise self._unopenable(exc) from exc
        self._needed = 0  # the bytes of data.mdb that the transactions begun so far read
        try:
            with self._beginning() as environment:
                self._txn = environment.begin(buffers=False)
                self._check_tree(environment)
        except UserError:
            os.close(self._descriptor)
            raise
        self._view_txn: lmdb.Transaction[memoryview] | None = None  # begun on the first view
        self._locator: ValueLocator | None = None  # made by the first prefetch

    @contextmanager
    def _beginning(self) -> Iterator[lmdb.Environment]:
        """The environment to begin a transaction in (a read of the map: _reading), data.mdb's
        length needed updated to the newest transaction's."""
        assert self._env is not None, "a read of a closed LMDB"
        self._needed = max(self._needed, lmdb_safety.bytes_needed(self._env))
        with self._reading():
            yield self._env

    _READ_ERRORS = (lmdb.Error,)  # a damaged page, a reader table full, a map outgrown

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """A read of the map, after data.mdb is checked to hold the pages it may touch."""
        self._check_complete()
        with super()._reading():
            yield

    def _check_complete(self) -> None:
        lmdb_safety.check_complete(self.path, os.fstat(self._descriptor).st_size, self._needed)

    def _check_tree(self, environment: lmdb.Environment) -> None:
        """The B-tree of this reader's snapshot checked before LMDB walks it (lmdb_tree): once for
        a process and those it starts (input processes, a launcher's training processes)."""
        info = os.fstat(self._descriptor)
        parts = (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, self._txn.id())
        snapshot = ":".join(map(str, parts))
        if not _tree_checked(snapshot):
            page_size = environment.stat()["psize"]
            lmdb_tree.check_tree(self.path, self._descriptor, page_size, self._txn.id())
            _record_tree_checked(snapshot)

    def _read_keys(self) -> list[bytes]:
        with self._reading(), self._txn.cursor() as cursor:
            return list(cursor.iternext(keys=True, values=False))

    def _lookup(self, key: bytes) -> bytes | None:
        return self._get(self._txn, key)

    def _lookup_view(self, key: bytes) -> bytes | memoryview | None:
        if self._view_txn is None:
            with self._beginning() as environment:
                self._view_txn = environment.begin(buffers=True)
        return self._get(self._view_txn, key)

    def _get(self, transaction: lmdb.Transaction[_Value], key: bytes) -> _Value | None:
        """`key`'s value, as _reading reads (without a context manager's cost: once a record)."""
        self._check_complete()
        try:
            return transaction.get(key)
        except lmdb.Error as exc:
            raise self._unreadable(exc) from exc

    def prefetch(self, keys: Iterable[bytes]) -> None:
        """The values asked of storage as ValueLocator.prefetch says."""
        keys = list(keys)
        if not keys:
            return
        if self._locator is None:
            self._lookup_view(keys[0])  # begins the view transaction the locator reads through
        if self._view_txn is None or self._env is None:
            return
        with self._reading():  # the locator reads leaf pages in the map
            if self._locator is None:
                self._locator = ValueLocator(
                    self._env, self._view_txn, keys[0], self.path, self._descriptor
                )
            self._locator.prefetch(keys)

    def items(self) -> Iterator[tuple[bytes, bytes | memoryview]]:
        # Views into the map, not copies: a reader of a few bytes of each value pages in only those.
        with self._beginning() as environment:
            txn = environment.begin(buffers=True)
        with txn, txn.cursor() as cursor:
            try:
                more = cursor.first()
                while more:
                    yield bytes(cursor.key()), cursor.value()
                    self._check_complete()  # before the cursor reads the next pages
                    more = cursor.next()
            except lmdb.Error as exc:
                raise self._unreadable(exc) from exc

    def close(self) -> None:
        if self._env is not None:
            self._txn.abort()
            del self._txn  # it holds the environment too
            self._locator = None  # its cursor belongs to the view transaction
            if self._view_txn is not None:
                self._view_txn.abort()
                self._view_txn = None
            os.close(self._descriptor)
            self._env = None  # the environment closes with its last reader
