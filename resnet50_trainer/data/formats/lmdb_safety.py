"""What an LMDB reader makes sure of before it touches LMDB's map, whose faults kill a process
rather than raise: a page past the end of data.mdb (a copy cut short) is a SIGBUS."""

from __future__ import annotations

import lmdb

from resnet50_trainer.errors import UserError


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
