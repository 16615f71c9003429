"""The database types a DB may be (--db_type of the trainer and of resnet50-db), named once here,
apart from the readers (databases.py) so that a parser offers them without importing LMDB or
LevelDB."""

from __future__ import annotations

LMDB = "lmdb"
LEVELDB = "leveldb"
DB_TYPES = (LMDB, LEVELDB)
