"""The files the benchmarks write (--json, BENCHMARKS.md, docs/speed.md): checked before any
measuring, and each written beside its place and renamed over it, so that a full disk or a stop
leaves the old file whole and no partial one."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks.errors import BenchmarkUsageError


def output_path(path: str | Path, flag: str, inputs: Sequence[Path] = ()) -> Path:
    """Where `flag`'s file goes: through a symbolic link to its target; refused (one line) where
    that is not a regular file or a new name in a writable folder, or is one of `inputs`."""
    if not str(path):
        raise BenchmarkUsageError(f"{flag} is empty: name a file")
    target = Path(path).resolve()
    if target.exists() and not target.is_file():
        raise BenchmarkUsageError(
            f"{flag} {path} is not a regular file (a folder, device or pipe): name a file"
        )
    if not target.parent.is_dir() or not os.access(target.parent, os.W_OK):
        raise BenchmarkUsageError(
            f"{flag} {path} cannot be written: name a file in a writable folder"
        )
    if any(target == source.resolve() for source in inputs):
        raise BenchmarkUsageError(f"{flag} {path} is also an input: name another file")
    return target


def replace_file(path: Path, text: str, flag: str) -> None:
    """`text` written to a temporary file beside `path`, then renamed over it."""
    descriptor, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "w") as file:
            file.write(text)
        os.chmod(partial, 0o644)
        os.replace(partial, path)
    except OSError as error:
        raise BenchmarkUsageError(
            f"{flag} {path} could not be written ({error.strerror}); it is unchanged"
        ) from None
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
