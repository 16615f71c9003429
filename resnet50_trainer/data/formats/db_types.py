"""The database types a DB may be (--db_type of the trainer and of resnet50-db): one table of what
names each and tells it apart on disk, which the parsers, the path checks (databases.py), the
readers' and writers' tables (READERS, WRITERS) and their refusals read. Apart from the readers so
that a parser offers them without importing LMDB or LevelDB."""

from __future__ import annotations

from dataclasses import dataclass

from resnet50_trainer.errors import UserError


@dataclass(frozen=True)
class DbType:
    """One database type."""

    name: str  # --db_type's value
    title: str  # the name messages give it
    article: str  # the title's indefinite article
    marker: str  # the file only a directory of this type holds
    files: str  # a regular expression of every file such a directory may hold


LMDB = "lmdb"
LEVELDB = "leveldb"

DB_TYPE_TABLE = {
    entry.name: entry
    for entry in (
        DbType(LMDB, "LMDB", "an", "data.mdb", r"data\.mdb|lock\.mdb"),
        # Its numbered logs, tables and manifests, its lock, info logs and CURRENT, and their
        # temporary files.
        DbType(
            LEVELDB,
            "LevelDB",
            "a",
            "CURRENT",
            r"CURRENT|LOCK|LOG|LOG\.old|MANIFEST-\d+|\d+\.(?:log|ldb|sst|dbtmp)",
        ),
    )
}
DB_TYPES = tuple(DB_TYPE_TABLE)


def unknown_db_type(db_type: str) -> UserError:
    """The refusal of a type not in the table, naming those that are."""
    return UserError(f"unknown database type {db_type!r}; use --db_type {' or '.join(DB_TYPES)}")
