"""What an LMDB reader makes sure of before it touches LMDB's map, whose faults kill a process
rather than raise: a page past the end of data.mdb (a copy cut short) is a SIGBUS, and a page that
another process's writer reuses under a reader it does not know of is read half rewritten, which
ends on one of LMDB's assertions (SIGABRT).

A writer leaves alone only the pages of the read transactions in its reader table (lock.mdb).
Readers open without it (lock=False: nothing written, no slot to run out of) unless another
process has the database open through LMDB's locking: then they register there (lock=True), or are
refused where lock.mdb is not theirs to write. A writer that does not lock (lock=False) or one that
starts after a reader opened cannot be seen: docs/data.md says so."""

from __future__ import annotations

import fcntl
import os
import stat
import struct

import lmdb

from resnet50_trainer.errors import UserError

# struct flock on 64-bit Linux: type, whence, start, length, pid (and padding)
_FLOCK = struct.Struct("@hhqqi4x")


def must_register(path: str) -> bool:
    """Whether a reader of the LMDB at `path` must register in its reader table (lock=True): some
    other process has it open through LMDB's locking, as a writer does. UserError where it
    cannot: lock.mdb not writable."""
    lock_file = os.path.join(path, "lock.mdb")
    holder = _lock_holder(lock_file)
    if holder is None:
        return False
    if not os.access(lock_file, os.R_OK | os.W_OK):
        raise UserError(
            f"LMDB {path} is open in another process (pid {holder}), which may be writing to it, "
            "and its lock.mdb is not writable by you, so a read cannot keep its pages from being "
            "reused; read it once that process has closed it"
        )
    return True


def _lock_holder(lock_file: str) -> int | None:
    """The pid of another process with the LMDB of `lock_file` open through LMDB's locking (each
    such process holds a shared fcntl lock on lock.mdb's first byte while it has it open), or
    None. Asked only where this process has no lock on it: closing the descriptor drops those."""
    try:  # O_NONBLOCK: a FIFO in its place must not hang the reader
        descriptor = os.open(lock_file, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return None  # no lock file LMDB could use
        asked = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0)
        kind, *_, pid = _FLOCK.unpack(fcntl.fcntl(descriptor, fcntl.F_GETLK, asked))
    except OSError:
        return None  # a filesystem without locks: none to see
    finally:
        os.close(descriptor)
    return None if kind == fcntl.F_UNLCK else pid


def bytes_needed(environment: lmdb.Environment) -> int:
    """How long data.mdb must be for the last page the newest transaction uses (its meta page,
    read without touching any other page)."""
    return (environment.info()["last_pgno"] + 1) * environment.stat()["psize"]


def check_complete(path: str, size: int, needed: int) -> None:
    """UserError unless data.mdb's `size` holds the `needed` bytes: a page past its end would
    kill the reader (SIGBUS)."""
    if size < needed:
        raise UserError(
            f"LMDB {path} is incomplete: its data.mdb is {size} bytes but its pages reach byte "
            f"{needed} (a copy cut short, a full disk, or a file being replaced); copy it again "
            "from its source, or build it again with `resnet50-db create`"
        )
