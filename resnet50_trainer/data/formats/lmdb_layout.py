"""LMDB's page layout (mdb.c's MDB_page and MDB_node, as a 64-bit build writes them), declared once
for the code that reads pages itself: the B-tree check (lmdb_tree) and the value locator
(lmdb_prefetch)."""

from __future__ import annotations

import struct

# MDB_page's header: number, padding, flags, lower and upper bounds; the nodes' 16-bit offsets
# follow it, from the lower bound's end of the page.
PAGE_HEADER = struct.Struct("=QHHHH")
PAGE_NUMBER = struct.Struct("=Q")  # pgno_t, a size_t: also where a large value's pages begin
LOWER = struct.Struct("=H")  # MDB_page.mp_lower
LOWER_AT = PAGE_NUMBER.size + 4  # after the number and two 16-bit fields
BRANCH, LEAF = 0x01, 0x02  # a page's kind, in its flags
PAGE_KINDS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40  # branch, leaf, overflow, meta, leaf2, sub

# MDB_node's header: data size (low and high 16 bits; a branch's child page), flags, key size;
# the key follows it, then the value, or with BIG_DATA the number of its first overflow page.
NODE_HEADER = struct.Struct("=HHHH")
BIG_DATA = 0x01
