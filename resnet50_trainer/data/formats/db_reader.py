"""The reader interface every database type's reader has (lmdb_reader.py, leveldb_reader.py): a
tiny one, `keys()` (sorted, computed once), `len()`, `get(key)`, `close()`, and the refusals of a
DB its library cannot open or read.

Open readers where they are used (inside each DataLoader worker, after fork), from the path and the
type (databases.open_database): never pass an open Database across process boundaries.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from resnet50_trainer.data.formats.db_types import DB_TYPE_TABLE
from resnet50_trainer.errors import UserError
from resnet50_trainer.limits import shortage_in
from resnet50_trainer.path_words import shown


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

    @property
    def _title(self) -> str:
        return DB_TYPE_TABLE[self.db_type].title

    def _said(self, error: Exception) -> str:
        """What the library says of `error`, in the database's terms."""
        return str(error)

    def _unopenable(self, error: Exception) -> UserError:
        """The one line for a DB its library could not open: a limit of the machine where that is
        why (LMDB maps the whole file: an address-space limit too small), else the DB's state."""
        named = f"{self._title} {shown(self.path)}"
        shortage = shortage_in(error)
        if shortage is not None:
            return UserError(f"cannot open {named}: {shortage}")
        return UserError(
            f"cannot open {named} ({error}); check that it is complete and not being written"
        )

    def _unreadable(self, error: Exception) -> UserError:
        """The library's `error` while reading (a damaged file, another process's writes)."""
        return UserError(
            f"cannot read {self._title} {shown(self.path)} ({self._said(error)}): "
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
