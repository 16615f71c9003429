"""Opening a database for reading: its path checked to hold a DB of the type given, the reader of
that type (READERS), and the keys that each training process reads once (read_keys).

`open_database` refuses an empty database unless `allow_empty=True` (only tools that report on a
database want to open an empty one; a trainer never does).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from resnet50_trainer.data.formats.db_reader import Database
from resnet50_trainer.data.formats.db_types import (
    DB_TYPE_TABLE,
    DB_TYPES,
    LEVELDB,
    LMDB,
    unknown_db_type,
)
from resnet50_trainer.data.formats.keys import KeyStore
from resnet50_trainer.data.formats.leveldb_reader import LevelDbDatabase
from resnet50_trainer.data.formats.lmdb_reader import LmdbDatabase
from resnet50_trainer.errors import UserError
from resnet50_trainer.path_words import check_reachable, shown, unreachable

# Each type's reader, opened on a path.
READERS: dict[str, Callable[[str], Database]] = {LMDB: LmdbDatabase, LEVELDB: LevelDbDatabase}


def detect_db_type(path: str) -> str | None:
    """The type of the database in directory `path`, told by the file only that type holds (the
    first found, in DB_TYPES' order), or None if it holds none."""
    for kind in DB_TYPE_TABLE.values():
        if os.path.isfile(os.path.join(path, kind.marker)):
            return kind.name
    return None


# The files a database's directory holds, whatever its type, and nothing else.
_DB_FILES = re.compile("|".join(kind.files for kind in DB_TYPE_TABLE.values()))


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
        raise unknown_db_type(db_type)
    check_reachable("database", path)
    if not os.path.exists(path):
        raise UserError(
            f"database {shown(path)} does not exist; check the path or build one with "
            "`resnet50-db create`"
        )
    types = DB_TYPE_TABLE.values()
    if not os.path.isdir(path):
        raise UserError(
            f"database {shown(path)} is a file, not a directory; pass the "
            f"{'/'.join(kind.title for kind in types)} directory (the one holding "
            f"{' or '.join(kind.marker for kind in types)})"
        )
    found = detect_db_type(path)
    if found is None:
        inside = unreachable(os.path.join(path, "CURRENT"))  # a folder this user may not enter
        kinds = " nor ".join(f"{kind.article} {kind.title} ({kind.marker})" for kind in types)
        raise UserError(
            f"database {shown(path)} cannot be read: {inside}"
            if inside
            else f"{shown(path)} holds neither {kinds}; pass the database directory itself"
        )
    if found != db_type:
        kind = DB_TYPE_TABLE[found]
        raise UserError(
            f"{shown(path)} is {kind.article} {kind.title} database but --db_type "
            f"{db_type} was given; pass --db_type {found}"
        )


def open_database(path: str, db_type: str, allow_empty: bool = False) -> Database:
    """Open `path` read-only; UserError if it is missing, of the other type, or empty."""
    check_database_path(path, db_type)
    database = READERS[db_type](path)
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
