"""The files the first process appends the run's reports to, the CSV run log and TensorBoard's
event file, written alike: created by this run (never one already there), each record appended
whole (synced to disk where asked) or not at all, and a write that fails (a full disk, a quota, the
file removed) one line that names the file, the reason and what is intact."""

from __future__ import annotations

import contextlib
import errno
import os

from resnet50_trainer.errors import UserError
from resnet50_trainer.path_words import shown


class ReportFile:
    """`what` names the file in messages ("the run log"), `records` what it holds ("rows")."""

    def __init__(self, path: str, what: str, records: str):
        """OSError where `path` cannot be created (FileExistsError where something is there)."""
        self.path, self.what, self.records = path, what, records
        self._descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)

    def append(self, data: bytes, sync: bool = True) -> None:
        """`data` appended whole, or nothing of it: OSError where it cannot be (a part already
        written is cut off again, so the file holds whole records only)."""
        remaining = memoryview(data)
        size = os.fstat(self._descriptor).st_size
        try:
            while remaining:
                remaining = remaining[os.write(self._descriptor, remaining) :]
            if sync:
                os.fsync(self._descriptor)
            if os.fstat(self._descriptor).st_nlink == 0:
                # Writes to a file whose name is gone succeed and vanish with it: all of it lost.
                raise FileNotFoundError(errno.ENOENT, "the log was removed while the run wrote it")
        except FileNotFoundError:
            raise
        except OSError:
            with contextlib.suppress(OSError):  # the write's error is the one to report
                os.ftruncate(self._descriptor, size)
            raise

    def failure(self, error: OSError) -> UserError:
        """The one line for an append's `error`."""
        if isinstance(error, FileNotFoundError):
            return UserError(
                f"{self.what} {shown(self.path)} is gone ({error.strerror}): its directory or the "
                "file was removed during the run; resume from the last checkpoint with a "
                "--log_dir that stays"
            )
        return write_failure(self.what, self.path, error, self.records)

    def close(self) -> None:
        os.close(self._descriptor)

    def discard(self) -> None:
        """Closed and removed: the file of a run that ends before its first record."""
        self.close()
        with contextlib.suppress(OSError):  # the error that ended the run is the one to report
            os.unlink(self.path)


def write_failure(what: str, path: str, error: OSError, intact: str | None = None) -> UserError:
    """The one line for a report file that cannot be written; `intact`: what it holds already."""
    kept = f"; the {intact} already written are intact" if intact else ""
    return UserError(
        f"writing {what} {shown(path)} failed ({error.strerror}): free space in --log_dir or "
        f"choose another{kept}"
    )
