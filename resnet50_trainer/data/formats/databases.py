"""LMDB and LevelDB key/value databases: readers opened in the process that uses them, and writers.

Readers have a tiny interface: `keys()` (sorted, computed once), `len()`, `get(key)`, `close()`.
Open them where they are used (inside each DataLoader worker, after fork), from the path and the
type: never pass an open Database across process boundaries.

`open_database` refuses an empty database unless `allow_empty=True` (only tools that report on a
database want to open an empty one; a trainer never does).
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import re
import shutil
import struct
import tempfile
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import lmdb
import numpy as np
import plyvel

from resnet50_trainer import cpython_private
from resnet50_trainer.data.formats import lmdb_safety, lmdb_tree
from resnet50_trainer.data.formats.db_types import DB_TYPES, LEVELDB, LMDB
from resnet50_trainer.data.formats.keys import KeyStore
from resnet50_trainer.errors import UserError
from resnet50_trainer.limits import shortage_in
from resnet50_trainer.path_words import check_reachable, denied, shown, unreachable

_DB_NAMES = {LMDB: "LMDB", LEVELDB: "LevelDB"}
_ARTICLES = {LMDB: "an", LEVELDB: "a"}


def detect_db_type(path: str) -> str | None:
    """LMDB or LEVELDB from the files in directory `path`, or None if it holds neither."""
    if os.path.isfile(os.path.join(path, "data.mdb")):
        return LMDB
    if os.path.isfile(os.path.join(path, "CURRENT")):
        return LEVELDB
    return None


# The files an LMDB or a LevelDB directory holds, and nothing else (a LevelDB's numbered logs,
# tables and manifests, its lock, info logs and CURRENT, and their temporary files).
_DB_FILES = re.compile(
    r"data\.mdb|lock\.mdb"
    r"|CURRENT|LOCK|LOG|LOG\.old|MANIFEST-\d+|\d+\.(?:log|ldb|sst|dbtmp)"
)


def holds_only_a_database(path: str) -> bool:
    """Whether directory `path` is a database and holds nothing but its files: what a command
    may replace (--overwrite) without destroying anything else."""
    if detect_db_type(path) is None:
        return False
    with os.scandir(path) as entries:
        return all(
            entry.is_file(follow_symlinks=False) and _DB_FILES.fullmatch(entry.name)
            for entry in entries
        )


def check_database_path(path: str, db_type: str) -> None:
    """Raise UserError (with the fix) unless `path` is a database of type `db_type`."""
    if db_type not in DB_TYPES:
        raise UserError(f"unknown database type {db_type!r}; use --db_type lmdb or leveldb")
    check_reachable("database", path)
    if not os.path.exists(path):
        raise UserError(
            f"database {shown(path)} does not exist; check the path or build one with "
            "`resnet50-db create`"
        )
    if not os.path.isdir(path):
        raise UserError(
            f"database {shown(path)} is a file, not a directory; pass the LMDB/LevelDB "
            "directory (the one holding data.mdb or CURRENT)"
        )
    found = detect_db_type(path)
    if found is None:
        inside = unreachable(os.path.join(path, "CURRENT"))  # a folder this user may not enter
        raise UserError(
            f"database {shown(path)} cannot be read: {inside}"
            if inside
            else f"{shown(path)} holds neither an LMDB (data.mdb) nor a LevelDB (CURRENT); "
            "pass the database directory itself"
        )
    if found != db_type:
        raise UserError(
            f"{shown(path)} is {_ARTICLES[found]} {_DB_NAMES[found]} database but --db_type "
            f"{db_type} was given; pass --db_type {found}"
        )


class Database(ABC):
    """A read-only view of one database."""

    def __init__(self, path: str, db_type: str) -> None:
        self.path = path
        self.db_type = db_type
        self._keys: list[bytes] | None = None

    def keys(self) -> list[bytes]:
        """All keys in sorted (byte) order; read once, then cached."""
        if self._keys is None:
            self._keys = self._read_keys()
        return self._keys

    def __len__(self) -> int:
        return len(self.keys())

    def is_empty(self) -> bool:
        """Whether the DB holds no record, without reading every key (1.28M keys: 0.5 s)."""
        if self._keys is not None:
            return not self._keys
        records = self.items()
        try:
            return next(records, None) is None
        finally:
            close = getattr(records, "close", None)
            if close is not None:
                close()  # ends LMDB's read transaction now, not when collected

    @abstractmethod
    def _read_keys(self) -> list[bytes]:
        """All keys, in the database's (sorted) order."""

    _READ_ERRORS: tuple[type[Exception], ...]  # the library's errors while reading

    def _said(self, error: Exception) -> str:
        """What the library says of `error`, in the database's terms."""
        return str(error)

    def _unreadable(self, error: Exception) -> UserError:
        """The library's `error` while reading (a damaged file, another process's writes)."""
        return UserError(
            f"cannot read {_DB_NAMES[self.db_type]} {shown(self.path)} ({self._said(error)}): "
            "it is damaged, or another process writes to it; copy it again from its source once "
            "nothing writes to it"
        )

    @contextmanager
    def _reading(self) -> Iterator[None]:
        """A read of the database, the library's errors in one line (_unreadable)."""
        try:
            yield
        except self._READ_ERRORS as exc:
            raise self._unreadable(exc) from exc

    def get(self, key: bytes) -> bytes:
        """The value stored under `key`; UserError if there is none."""
        return self._found(key, self._lookup(key))

    def view(self, key: bytes) -> bytes | memoryview:
        """The value stored under `key`, without a copy where the database allows it (LMDB: a
        view of its memory map, valid until this reader closes); UserError if there is none."""
        return self._found(key, self._lookup_view(key))

    def _found(self, key: bytes, value):
        if value is None:
            raise UserError(
                f"key {key!r} is not in database {shown(self.path)}; list keys with "
                "`resnet50-db inspect` or pick a record with `dump --index`"
            )
        return value

    @abstractmethod
    def _lookup(self, key: bytes) -> bytes | None:
        """The value stored under `key`, or None."""

    def _lookup_view(self, key: bytes) -> bytes | memoryview | None:
        return self._lookup(key)

    @abstractmethod
    def items(self) -> Iterator[tuple[bytes, bytes | memoryview]]:
        """Every (key, value) in key order, the value possibly a view valid for this step only."""

    @abstractmethod
    def prefetch(self, keys: Iterable[bytes]) -> None:
        """Asks the storage for these records' bytes now, all at once, so that reading them next
        waits on the slowest request rather than on each record's in turn: a DB on a cold or
        network disk is then read at the rate its storage serves requests. One already in the
        page cache costs a B-tree lookup a record."""

    @abstractmethod
    def close(self) -> None:
        """Release the database; closing twice is harmless."""

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


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


def _cannot_open(kind: str, path: str, error: Exception) -> UserError:
    """The one line for a DB its library could not open: a limit of the machine where that is
    why (LMDB maps the whole file: an address-space limit too small), else the DB's state."""
    shortage = shortage_in(error)
    if shortage is not None:
        return UserError(f"cannot open {kind} {shown(path)}: {shortage}")
    return UserError(
        f"cannot open {kind} {shown(path)} ({error}); check that it is complete and not being "
        "written"
    )


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
            raise _cannot_open("LMDB", path, exc) from exc
        self._needed = 0  # the bytes of data.mdb that the transactions begun so far read
        try:
            with self._beginning() as environment:
                self._txn = environment.begin(buffers=False)
                self._check_tree(environment)
        except UserError:
            os.close(self._descriptor)
            raise
        self._view_txn: lmdb.Transaction[memoryview] | None = None  # begun on the first view
        self._locator: _ValueLocator | None = None  # made by the first prefetch
        self._prefetches = 0
        self._all_cached = False  # as the last residency check found

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
        """Each contiguous stretch of data.mdb that the records' values fill becomes one
        read-ahead request (posix_fadvise WILLNEED), all sent before any is waited for. Without
        it a value came in one 4 KB page fault at a time: py-lmdb touches every page of a value
        before get() returns (its "preload"), and the map has no read-ahead (random reads must
        not drag in their neighbours): 8 synchronous reads for a 30 KB record, 27 for ImageNet's
        110 KB. Where the values cannot be located (_ValueLocator), nothing is asked."""
        keys = list(keys)
        if not keys:
            return
        if self._locator is None:
            self._lookup_view(keys[0])  # begins the view transaction the locator reads through
        if self._view_txn is None or self._env is None:
            return
        with self._reading():  # the locator reads leaf pages in the map
            if self._locator is None:
                self._locator = _ValueLocator(self._env, self._view_txn, keys[0], self.path)
            self._ask_storage(self._locator, keys)

    def _ask_storage(self, locator: _ValueLocator, keys: list[bytes]) -> None:
        descriptor = self._descriptor
        if self._prefetches % _RESIDENCY_CHECK_EVERY == 0:
            # Locating a value costs ~10 us: not spent while the whole DB is in the page cache.
            self._all_cached = locator.cached_share(0, os.fstat(descriptor).st_size) > 0.99
        self._prefetches += 1
        if self._all_cached:
            return
        for start, length in _merged(locator.spans(keys)):
            if length > _STRAY_PAGES_DROPPED_FROM and 0 < locator.cached_share(start, length) < 0.5:
                # Pages cached here and there (listing the keys reads each large value's first
                # page) would split the request at each: dropped, the stretch goes out whole.
                os.posix_fadvise(descriptor, start, length, os.POSIX_FADV_DONTNEED)
            os.posix_fadvise(descriptor, start, length, os.POSIX_FADV_WILLNEED)

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


class _ValueLocator:
    """Where records' values lie in data.mdb, read from their B-tree nodes without touching the
    values. `Cursor.set_key` positions on a key's node (LMDB reads the first page of a large
    value then, nothing more, and py-lmdb's preload is not run); `Cursor.key()` is a view into the
    leaf page, right after the node's header (LMDB's MDB_node: data size low and high 16 bits,
    flags, key size). The leaf page (MDB_page: number, padding, flags, lower and upper bounds,
    then the nodes' offsets) gives the nodes after it, whose values are located from the page
    alone: a run of consecutive records costs one positioning a leaf page, one touched first
    page. A large value (F_BIGDATA) lives on overflow pages whose number follows the key, after
    their page header. Checked once against real get()s: where they disagree (another LMDB
    on-disk format), `spans` answers nothing and nothing is asked."""

    _NODE = struct.Struct("=HHHH")
    _PAGE_NUMBER = struct.Struct("@N")  # pgno_t: a size_t
    _LOWER = struct.Struct("=H")  # MDB_page.mp_lower, after the number and two 16-bit fields
    _LOWER_AT = _PAGE_NUMBER.size + 4
    _BIG_DATA = 0x01
    _PAGE_HEADER = 16

    def __init__(
        self,
        environment: lmdb.Environment,
        transaction: lmdb.Transaction,
        key: bytes,
        path: str,  # the environment's: py-lmdb's path() fails on a name that is not UTF-8
    ):
        self._cursor = transaction.cursor()
        self._page_size = int(environment.stat()["psize"])
        self._map = _mapped_at(os.path.join(path, "data.mdb"))
        self._works = self._map is not None
        checked = [key]
        if self._cursor.set_key(key) and self._cursor.next():
            checked.append(bytes(self._cursor.key()))  # located from the first one's leaf page
        values = [transaction.get(one) for one in checked]
        self._works = self._works and self.spans(checked) == [
            (_address(value) - (self._map or 0), len(value))
            for value in values
            if value is not None
        ]

    def spans(self, keys: Iterable[bytes]) -> list[tuple[int, int]]:
        """(offset in data.mdb, length) of the values under those of `keys` that are in the DB,
        in key order."""
        if not self._works:
            return []
        wanted, spans, i = sorted(set(keys)), [], 0
        while i < len(wanted):
            if not self._cursor.set_key(wanted[i]):
                i += 1
                continue
            node = _address(self._cursor.key()) - self._NODE.size
            nodes = self._leaf_nodes(node)
            if node not in nodes:  # not a plain leaf page: located one at a time
                spans.append(self._node_span(node))
                i += 1
                continue
            j, last_key = nodes.index(node), self._node_key(nodes[-1])
            while i < len(wanted) and j < len(nodes) and wanted[i] <= last_key:
                key = self._node_key(nodes[j])
                if key < wanted[i]:
                    j += 1
                elif key == wanted[i]:
                    spans.append(self._node_span(nodes[j]))
                    i, j = i + 1, j + 1
                else:  # not in the DB
                    i += 1
        return spans

    def cached_share(self, start: int, length: int) -> float:
        """The share of the map's bytes [start, start + length) in the page cache (mincore); 0
        where it cannot be told (the map not found, or mincore refused: it answers for files one
        may write, or for pages this process mapped)."""
        if self._map is None or length <= 0:
            return 0.0
        first = start - start % mmap.PAGESIZE
        length += start - first
        pages = -(-length // mmap.PAGESIZE)
        residency = np.zeros(pages, dtype=np.uint8)
        vector = residency.ctypes.data_as(ctypes.c_void_p)
        if _LIBC.mincore(ctypes.c_void_p(self._map + first), length, vector) != 0:
            return 0.0
        return int(np.count_nonzero(residency & 1)) / pages

    def _leaf_nodes(self, node: int) -> list[int]:
        """The addresses of the nodes of the leaf page holding the node at `node`, in key order."""
        page = node - (node - (self._map or 0)) % self._page_size
        (lower,) = self._LOWER.unpack(ctypes.string_at(page + self._LOWER_AT, self._LOWER.size))
        count = (lower - self._PAGE_HEADER) // 2
        offsets = np.frombuffer(ctypes.string_at(page + self._PAGE_HEADER, 2 * count), np.uint16)
        return (page + offsets.astype(np.int64)).tolist()

    def _node_key(self, node: int) -> bytes:
        *_, key_size = self._NODE.unpack(ctypes.string_at(node, self._NODE.size))
        return ctypes.string_at(node + self._NODE.size, key_size)

    def _node_span(self, node: int) -> tuple[int, int]:
        low, high, flags, key_size = self._NODE.unpack(ctypes.string_at(node, self._NODE.size))
        length, data = low | high << 16, node + self._NODE.size + key_size
        if flags & self._BIG_DATA:
            (page,) = self._PAGE_NUMBER.unpack(ctypes.string_at(data, self._PAGE_NUMBER.size))
            return page * self._page_size + self._PAGE_HEADER, length
        return data - (self._map or 0), length  # in the leaf page itself


def _mapped_at(path: str) -> int | None:
    """Where this process maps the start of the file at `path` (/proc/self/maps), or None. LMDB
    reports its map's address only for MDB_FIXEDMAP environments."""
    info = os.stat(path)
    device = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}"
    try:
        with open("/proc/self/maps", errors="surrogateescape") as maps:  # paths, any bytes
            for line in maps:
                fields = line.split()
                if len(fields) >= 6 and fields[2:5] == ["00000000", device, str(info.st_ino)]:
                    return int(fields[0].split("-")[0], 16)
    except OSError:
        pass
    return None


def _address(value: memoryview | bytes) -> int:
    """Where a view of LMDB's map starts in this process's memory."""
    return int(np.frombuffer(value, dtype=np.uint8).ctypes.data)


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(start, length) spans of a file, sorted, those less than a page apart joined: neighbouring
    records become one request."""
    merged: list[tuple[int, int]] = []
    for start, length in sorted(spans):
        if merged and start <= merged[-1][0] + merged[-1][1] + _PAGE:
            first, extent = merged[-1]
            merged[-1] = (first, max(extent, start + length - first))
        else:
            merged.append((start, length))
    return merged


_PAGE = 4096
# A stretch of values longer than this (a run of --read_order quasi_random) is asked for whole, its
# stray cached pages dropped first; a record's value alone keeps its cached first page.
_STRAY_PAGES_DROPPED_FROM = 256 * 1024
# Prefetch asks the page cache whether the whole DB is there once in this many batches.
_RESIDENCY_CHECK_EVERY = 64
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]

# LevelDB lets only one process open a database, even for reading, and opening it rewrites files
# (it replays and rotates the log, writes a new MANIFEST and may compact). So no reader ever opens
# the original directory: each one opens a private snapshot, a temporary directory holding copies
# of the small metadata files and symbolic links to the table files (*.ldb / *.sst). LevelDB never
# modifies an existing table file; whatever it rewrites, renames or deletes in the snapshot touches
# only the copies and the links. Any number of processes can thus read one LevelDB at once, and
# reading never changes it. The snapshot is removed on close, or when its process exits.
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
            raise _cannot_open("LevelDB", path, exc) from exc
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


def open_database(path: str, db_type: str, allow_empty: bool = False) -> Database:
    """Open `path` read-only; UserError if it is missing, of the other type, or empty."""
    check_database_path(path, db_type)
    database = LmdbDatabase(path) if db_type == LMDB else LevelDbDatabase(path)
    if not allow_empty and database.is_empty():
        database.close()
        raise UserError(
            f"database {shown(path)} holds no records; check that it was built completely "
            "(resnet50-db inspect shows what is in it)"
        )
    return database


def read_keys(path: str, db_type: str) -> KeyStore:
    """All keys of a DB in key order, read once by each training process; UserError if empty."""
    with open_database(path, db_type) as database:
        return KeyStore.pack(database.keys())
