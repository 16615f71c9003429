"""A run's hold on its checkpoint names: `.{save_model_name}.lock` in the checkpoint directory,
flocked by one run at a time, so that a second run never writes (or cleans up) the same names.
The file is there while a run holds it: the holder removes it as it lets go (a killed run's stays
until the next run takes it over)."""

from __future__ import annotations

import errno
import fcntl
import os

from resnet50_trainer.checkpoint.files import SUFFIX
from resnet50_trainer.errors import UserError
from resnet50_trainer.path_words import shown

# Takes of a lock file that its holder removed between our open and our flock, before we give up.
_TAKES = 10


class CheckpointLock:
    """This run's hold on its checkpoint names: an open descriptor with a flock, released by
    release() or, for a crashed run, by the kernel when the process dies. Forked input processes
    close their copy, so that ones outliving a killed run do not keep its lock."""

    def __init__(self, descriptor: int, path: str):
        self.descriptor: int | None = descriptor
        self.path = path
        os.register_at_fork(after_in_child=self._close)

    def release(self) -> None:
        """Remove the file, then let go of it. Removed while still held: a run that opened the
        file meanwhile finds, once it holds the lock, that the path no longer names its file, and
        takes the path's new one (_take)."""
        if self.descriptor is not None:
            try:
                os.unlink(self.path)
            except OSError:
                pass  # gone, or the directory turned read-only: the flock is what counts
            self._close()

    def _close(self) -> None:
        if self.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = None


def lock_checkpoints(directory: str, name: str) -> CheckpointLock:
    """Lock this name's checkpoints in `directory` for this run."""
    path = os.path.join(directory, f".{name}.lock")
    for _ in range(_TAKES):
        descriptor = _take(path, name, directory)
        if descriptor is not None:
            return CheckpointLock(descriptor, path)
    raise UserError(
        f"the lock file {shown(path)} was replaced {_TAKES} times while this run took it: "
        "another run keeps starting and stopping there; give this run another --checkpoint_dir or "
        "--save_model_name"
    )


def _take(path: str, name: str, directory: str) -> int | None:
    """A descriptor of the lock file at `path`, flocked; None when its holder removed it between
    our open and our flock (the path names another file, or none)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)  # read-only: no write-open file
    except OSError as error:
        raise UserError(
            f"cannot create the lock file {shown(path)} ({error.strerror}): choose a "
            "writable --checkpoint_dir"
        ) from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(descriptor)
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise UserError(
                f"another run is writing checkpoints {name}_*{SUFFIX} in {shown(directory)} "
                f"(it holds {shown(path)}): wait for it to end, or give this run another "
                "--checkpoint_dir or --save_model_name"
            ) from None
        raise UserError(
            f"cannot lock {shown(path)} ({error.strerror}): choose a --checkpoint_dir on a "
            "file system with file locks"
        ) from None
    if _same_file(descriptor, path):
        return descriptor
    os.close(descriptor)
    return None


def _same_file(descriptor: int, path: str) -> bool:
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(descriptor)
    return (held.st_dev, held.st_ino) == (at_path.st_dev, at_path.st_ino)
