"""An LMDB's B-tree checked page by page before LMDB walks it. LMDB trusts its pages and checks
them with assertions: a damaged one (zeroed by a crash, overwritten) aborts the process (SIGABRT,
"mdb.c: Assertion 'IS_LEAF(mp)' failed") or sends it reading outside its map (SIGSEGV).

Pages are read with pread, never through the map. Each branch and leaf page must carry its own
number, be of the kind its depth calls for, and hold nodes that lie within it; a large value's
overflow pages must lie within the DB's pages. The values' bytes are not read: a damaged value is a
record that does not parse, which training skips and counts."""

from __future__ import annotations

import os
import struct

import numpy as np

from resnet50_trainer.data.formats.lmdb_layout import (
    BIG_DATA,
    BRANCH,
    LEAF,
    NODE_HEADER,
    PAGE_HEADER,
    PAGE_KINDS,
    PAGE_NUMBER,
)
from resnet50_trainer.errors import UserError

# MDB_meta, after its page's header: the main DB's flags and depth, its root, the last page, and
# the transaction that wrote it.
_MAIN_DB = struct.Struct("=HHQQQQQ")  # md_flags, md_depth, pages of 3 kinds, entries, md_root
_HEADER, _NODE = PAGE_HEADER.size, NODE_HEADER.size  # bytes
_MAIN_DB_AT = _HEADER + 4 + 4 + 8 + 8 + 48 + 4  # magic, version, address, size, the free DB
_LAST = struct.Struct("=QQ")  # mm_last_pg, mm_txnid
_LAST_AT = _MAIN_DB_AT + _MAIN_DB.size
_NO_ROOT = 2**64 - 1  # P_INVALID: an empty DB
_PAGES_AT_ONCE = 4096  # 16 MB of 4 KB pages


def check_tree(path: str, descriptor: int, page_size: int, transaction: int) -> None:
    """UserError naming the first damaged page of the main B-tree that `transaction` reads;
    nothing is checked where a writer has since reused that transaction's meta page."""
    meta = _meta(descriptor, page_size, transaction)
    if meta is None:
        return
    root, depth, last = meta
    if root == _NO_ROOT:
        return
    level, pages = depth, np.array([root], dtype=np.int64)
    while len(pages):  # level by level, the pages of each read and checked together
        if not _ordinary(pages, last):
            raise _damaged(path, int(pages[(pages < 2) | (pages > last)][0]))
        children = []
        for start in range(0, len(pages), _PAGES_AT_ONCE):
            chunk = pages[start : start + _PAGES_AT_ONCE]
            found = _children(_read(descriptor, chunk, page_size), chunk, level, last)
            if isinstance(found, int):
                raise _damaged(path, found)
            children.append(found)
        level, pages = level - 1, np.concatenate(children)


def _meta(descriptor: int, page_size: int, transaction: int) -> tuple[int, int, int] | None:
    """(root, depth, last page) of the main DB as `transaction` wrote them, from the meta page
    (0 or 1) that holds them."""
    for number in (0, 1):
        meta = os.pread(descriptor, _LAST_AT + _LAST.size, number * page_size)
        if len(meta) < _LAST_AT + _LAST.size:
            return None
        _, depth, *_, root = _MAIN_DB.unpack_from(meta, _MAIN_DB_AT)
        last, written_by = _LAST.unpack_from(meta, _LAST_AT)
        if written_by == transaction:
            return root, depth, last
    return None


def _ordinary(numbers: np.ndarray, last: int) -> bool:
    """Whether pages `numbers` may hold the tree: past the two meta pages, not past the last."""
    return bool(((numbers >= 2) & (numbers <= last)).all())


def _read(descriptor: int, numbers: np.ndarray, page_size: int) -> np.ndarray:
    """Pages `numbers`, a row each (a short read leaves zeros: no page). Consecutive numbers are
    read together: a DB written in key order lays its leaves out in order, one read for many."""
    pages = np.zeros((len(numbers), page_size), dtype=np.uint8)
    breaks = (np.flatnonzero(np.diff(numbers) != 1) + 1).tolist()
    for start, end in zip([0, *breaks], [*breaks, len(numbers)]):
        os.preadv(descriptor, [pages[start:end].data], int(numbers[start]) * page_size)
    return pages


def _children(pages: np.ndarray, numbers: np.ndarray, level: int, last: int) -> np.ndarray | int:
    """The page numbers the branch `pages` point to (none for leaf pages: `level` 1), or the
    number of the first page that is not a sound page of its kind."""
    page_size = pages.shape[1]
    words = pages.view(np.uint16)
    own = pages[:, :8].copy().view(np.uint64).ravel()
    flags, lower, upper = (words[:, i].astype(np.int64) for i in (5, 6, 7))
    branch = level > 1
    counts = (lower - _HEADER) // 2
    bad = (
        (own != numbers.astype(np.uint64))
        | (flags & PAGE_KINDS != (BRANCH if branch else LEAF))
        | (lower < _HEADER)
        | (lower > upper)
        | (upper > page_size)
        | (counts < (2 if branch else 1))  # LMDB asserts a branch page's two keys
    )
    if bad.any():
        return int(numbers[bad][0])
    # Every node of every page, flattened: its page's row, and its offset in the page.
    columns = np.arange(counts.max())
    rows, slots = np.nonzero(columns < counts[:, None])
    offsets = words[rows, _HEADER // 2 + slots].astype(np.int64)
    bad_nodes = (offsets % 2 != 0) | (offsets < upper[rows]) | (offsets > page_size - _NODE)
    if bad_nodes.any():
        return int(numbers[rows[bad_nodes][0]])
    low, high, node_flags, key_sizes = (
        words[rows, offsets // 2 + i].astype(np.int64) for i in range(4)
    )
    after_keys = offsets + _NODE + key_sizes
    if branch:
        children = low | high << 16 | node_flags << 32
        bad_nodes = after_keys > page_size
        return int(numbers[rows[bad_nodes][0]]) if bad_nodes.any() else children
    sizes = low | high << 16
    big = node_flags & BIG_DATA != 0
    bad_nodes = np.where(big, after_keys + PAGE_NUMBER.size, after_keys + sizes) > page_size
    if bad_nodes.any():
        return int(numbers[rows[bad_nodes][0]])
    spots = after_keys[big][:, None] + np.arange(PAGE_NUMBER.size)
    overflow = pages[rows[big][:, None], spots].copy().view(np.uint64).ravel()
    ends = np.minimum(overflow, last + 1).astype(np.int64) * page_size + _HEADER + sizes[big]
    bad_values = (overflow < 2) | (overflow > last) | (ends > (last + 1) * page_size)
    return int(numbers[rows[big][bad_values][0]]) if bad_values.any() else np.array([], np.int64)


def _damaged(path: str, page: int) -> UserError:
    return UserError(
        f"LMDB {path} is damaged: page {page} of its B-tree does not read as one (zeroed or "
        "overwritten); copy it again from its source, or build it again with `resnet50-db create`"
    )
