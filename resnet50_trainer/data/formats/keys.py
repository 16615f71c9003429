"""A DB's keys as the training process holds them for its input processes, and as reports print
them."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np


def printable_key(key: bytes) -> str:
    """A key as one line of text: UTF-8 where it decodes, each other byte as \\xNN, and each
    control or other unprintable character escaped as Python writes it (\\n, \\x1b, \\u2028):
    a key holding a newline or a terminal escape cannot split a report or drive the terminal."""
    text = key.decode("utf-8", "backslashreplace")
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


class KeyStore(Sequence[bytes]):
    """Keys packed into one byte buffer with their offsets: two numpy arrays, whatever the count.
    Input processes inherit it from the training process by fork and share its pages: reading a
    key writes to neither array, whereas a list's bytes objects get their reference counts updated
    on every read, so each process would end up copying every page (~100 MB at 1.28M keys)."""

    def __init__(self, buffer: np.ndarray, offsets: np.ndarray) -> None:
        self._buffer, self._offsets = buffer, offsets  # key i: buffer[offsets[i]:offsets[i + 1]]

    @classmethod
    def pack(cls, keys: Sequence[bytes]) -> KeyStore:
        offsets = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, keys), dtype=np.int64, count=len(keys)), out=offsets[1:])
        return cls(np.frombuffer(b"".join(keys), dtype=np.uint8), offsets)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, item):
        if isinstance(item, slice):
            start, stop, step = item.indices(len(self))
            if step != 1:
                return KeyStore.pack([self[index] for index in range(start, stop, step)])
            # A view: the slice shares this store's buffer.
            return KeyStore(self._buffer, self._offsets[start : max(start, stop) + 1])
        index = range(len(self))[item]  # negative indices, and IndexError past the end
        return self._buffer[self._offsets[index] : self._offsets[index + 1]].tobytes()

    def __iter__(self) -> Iterator[bytes]:
        return (self[index] for index in range(len(self)))
