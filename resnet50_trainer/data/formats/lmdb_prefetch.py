"""An LMDB reader's prefetch: where records' values lie in data.mdb, read from their B-tree's leaf
pages without touching the values (ValueLocator), and each stretch they fill asked of storage at
once (posix_fadvise), unless the page cache holds the DB already (mincore)."""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterable

import lmdb
import numpy as np

from resnet50_trainer.data.formats.lmdb_layout import (
    BIG_DATA,
    LOWER,
    LOWER_AT,
    NODE_HEADER,
    PAGE_HEADER,
    PAGE_NUMBER,
)

_JOINED_WITHIN = 4096  # bytes between two spans (a page) that one request spans too
# A stretch of values longer than this (a run of --read_order quasi_random) is asked for whole, its
# stray cached pages dropped first; a record's value alone keeps its cached first page.
_STRAY_PAGES_DROPPED_FROM = 256 * 1024
# Prefetch asks the page cache whether the whole DB is there once in this many batches.
_RESIDENCY_CHECK_EVERY = 64
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


class ValueLocator:
    """Where records' values lie in data.mdb, read from their B-tree nodes without touching the
    values, and those values asked of storage (`prefetch`). `Cursor.set_key` positions on a key's
    node (LMDB reads the first page of a large value then, nothing more, and py-lmdb's preload is
    not run); `Cursor.key()` is a view into the leaf page, right after the node's header
    (lmdb_layout). The leaf page's header gives the nodes after it, whose values are located from
    the page alone: a run of consecutive records costs one positioning a leaf page, one touched
    first page. A large value (BIG_DATA) lives on overflow pages whose number follows the key,
    after their page header. Checked once against real get()s: where they disagree (another LMDB
    on-disk format), `spans` answers nothing and nothing is asked."""

    def __init__(
        self,
        environment: lmdb.Environment,
        transaction: lmdb.Transaction,
        key: bytes,
        path: str,  # the environment's: py-lmdb's path() fails on a name that is not UTF-8
        descriptor: int,  # data.mdb's, open for reading: where the requests go
    ):
        self._descriptor = descriptor
        self._prefetches = 0
        self._all_cached = False  # as the last residency check found
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
            node = _address(self._cursor.key()) - NODE_HEADER.size
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

    def prefetch(self, keys: list[bytes]) -> None:
        """Each contiguous stretch of data.mdb that the records' values fill becomes one
        read-ahead request (posix_fadvise WILLNEED), all sent before any is waited for. Without
        it a value came in one 4 KB page fault at a time: py-lmdb touches every page of a value
        before get() returns (its "preload"), and the map has no read-ahead (random reads must
        not drag in their neighbours): 8 synchronous reads for a 30 KB record, 27 for ImageNet's
        110 KB. Where the values cannot be located (`spans`), nothing is asked."""
        descriptor = self._descriptor
        if self._prefetches % _RESIDENCY_CHECK_EVERY == 0:
            # Locating a value costs ~10 us: not spent while the whole DB is in the page cache.
            self._all_cached = self.cached_share(0, os.fstat(descriptor).st_size) > 0.99
        self._prefetches += 1
        if self._all_cached:
            return
        for start, length in _merged(self.spans(keys)):
            if length > _STRAY_PAGES_DROPPED_FROM and 0 < self.cached_share(start, length) < 0.5:
                # Pages cached here and there (listing the keys reads each large value's first
                # page) would split the request at each: dropped, the stretch goes out whole.
                os.posix_fadvise(descriptor, start, length, os.POSIX_FADV_DONTNEED)
            os.posix_fadvise(descriptor, start, length, os.POSIX_FADV_WILLNEED)

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
        (lower,) = LOWER.unpack(ctypes.string_at(page + LOWER_AT, LOWER.size))
        count = (lower - PAGE_HEADER.size) // 2
        offsets = np.frombuffer(ctypes.string_at(page + PAGE_HEADER.size, 2 * count), np.uint16)
        return (page + offsets.astype(np.int64)).tolist()

    def _node_key(self, node: int) -> bytes:
        *_, key_size = NODE_HEADER.unpack(ctypes.string_at(node, NODE_HEADER.size))
        return ctypes.string_at(node + NODE_HEADER.size, key_size)

    def _node_span(self, node: int) -> tuple[int, int]:
        low, high, flags, key_size = NODE_HEADER.unpack(ctypes.string_at(node, NODE_HEADER.size))
        length, data = low | high << 16, node + NODE_HEADER.size + key_size
        if flags & BIG_DATA:
            (page,) = PAGE_NUMBER.unpack(ctypes.string_at(data, PAGE_NUMBER.size))
            return page * self._page_size + PAGE_HEADER.size, length
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
        if merged and start <= merged[-1][0] + merged[-1][1] + _JOINED_WITHIN:
            first, extent = merged[-1]
            merged[-1] = (first, max(extent, start + length - first))
        else:
            merged.append((start, length))
    return merged
