"""Writing an image database: LMDB and LevelDB writers that commit in batches and finish what they
began (resnet50-db create and the tests write through them), the writer of each DB type (WRITERS)
and the keys each can store."""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterable

import lmdb
import plyvel

from resnet50_trainer.data.formats.db_types import DB_TYPE_TABLE, LEVELDB, LMDB, unknown_db_type
from resnet50_trainer.data.formats.keys import printable_key
from resnet50_trainer.errors import UserError


class DatabaseWriter(ABC):
    """Buffers `put`s and commits them in batches; `close()` commits the rest and finishes."""

    def __init__(self, path: str, batch_size: int) -> None:
        self.path = path
        self._batch_size = batch_size
        self._batch: list[tuple[bytes, bytes]] = []

    def put(self, key: bytes, value: bytes) -> None:
        self._batch.append((key, value))
        if len(self._batch) >= self._batch_size:
            self._commit_batch()

    def _commit_batch(self) -> None:
        if self._batch:
            self._commit(self._batch)
            self._batch = []

    @classmethod
    def longest_key(cls) -> int | None:
        """The most bytes a key may hold (keys have 1 at least), or None: any key fits."""
        return None

    @abstractmethod
    def _commit(self, batch: list[tuple[bytes, bytes]]) -> None:
        """Write `batch` durably in one transaction."""

    @abstractmethod
    def _finish(self) -> None:
        """Close the database, leaving it compact and ready to ship."""

    def close(self) -> None:
        self._commit_batch()
        self._finish()

    def __enter__(self) -> DatabaseWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class LmdbWriter(DatabaseWriter):
    """Starts with a small map and doubles it whenever a batch does not fit, so no terabyte
    reservation is needed; lock=False because only this writer touches the new environment."""

    _INITIAL_MAP_SIZE = 16 << 20

    def __init__(self, path: str, batch_size: int) -> None:
        super().__init__(path, batch_size)
        # Bytes: the libraries encode a str path as strict UTF-8, which a name the OS took may
        # not be.
        self._env = lmdb.open(
            os.fsencode(path), map_size=self._INITIAL_MAP_SIZE, subdir=True, lock=False
        )
        self._last_key: bytes | None = None

    @classmethod
    def longest_key(cls) -> int | None:
        """The LMDB library's maximum key size (511 bytes as built), asked of a throwaway
        environment (py-lmdb asks one)."""
        return _lmdb_max_key_size()

    def _commit(self, batch: list[tuple[bytes, bytes]]) -> None:
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    last_key = self._last_key
                    for key, value in batch:
                        # Appending keys in increasing order fills pages completely; inserting
                        # leaves them half full after splits (the file gets up to twice as big).
                        txn.put(key, value, append=last_key is None or key > last_key)
                        last_key = key if last_key is None else max(last_key, key)
                self._last_key = last_key
                return
            except lmdb.MapFullError:
                self._env.set_mapsize(self._env.info()["map_size"] * 2)

    def _finish(self) -> None:
        self._env.close()


class LevelDbWriter(DatabaseWriter):
    def __init__(self, path: str, batch_size: int) -> None:
        super().__init__(path, batch_size)
        self._db = plyvel.DB(os.fsencode(path), create_if_missing=True, error_if_exists=True)

    def _commit(self, batch: list[tuple[bytes, bytes]]) -> None:
        with self._db.write_batch() as write_batch:
            for key, value in batch:
                write_batch.put(key, value)

    def _finish(self) -> None:
        # Compacting flushes the memtable into tables, so no record is left pending in the log.
        self._db.compact_range()
        self._db.close()
        # LevelDB's info logs hold timestamps and are of no use in a finished database.
        for name in ("LOG", "LOG.old"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.path, name))


WRITERS: dict[str, type[DatabaseWriter]] = {LMDB: LmdbWriter, LEVELDB: LevelDbWriter}


def _writer_of(db_type: str) -> type[DatabaseWriter]:
    if db_type not in WRITERS:
        raise unknown_db_type(db_type)
    return WRITERS[db_type]


def check_keys_fit(keys: Iterable[bytes], db_type: str, fix: str) -> None:
    """UserError, saying `fix`, at the first of `keys` that a database of `db_type` cannot store
    (DatabaseWriter.longest_key)."""
    limit = _writer_of(db_type).longest_key()
    if limit is None:
        return
    unfit = next((key for key in keys if not 0 < len(key) <= limit), None)
    if unfit is not None:
        shown = printable_key(unfit[:_KEY_SHOWN]) + ("..." if len(unfit) > _KEY_SHOWN else "")
        kind = DB_TYPE_TABLE[db_type].title
        raise UserError(
            f"key {shown} is {len(unfit)} bytes, but {kind} keys are 1 to {limit} bytes; {fix}; "
            "nothing was written"
        )


_KEY_SHOWN = 60  # bytes of an unfit key the refusal shows


@functools.cache
def _lmdb_max_key_size() -> int:
    """Asked once: each ask makes an environment."""
    with tempfile.TemporaryDirectory() as directory:
        environment = lmdb.open(directory, lock=False)
        try:
            return environment.max_key_size()
        finally:
            environment.close()


def open_writer(path: str, db_type: str, batch_size: int = 1000) -> DatabaseWriter:
    """A writer creating a new database at `path` (which must not exist yet)."""
    writer = _writer_of(db_type)
    if os.path.exists(path):
        raise UserError(f"{path} already exists; choose a new path for the database")
    return writer(path, batch_size)
