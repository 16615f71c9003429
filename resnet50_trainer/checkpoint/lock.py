"""A run's hold on its checkpoint names: `.{save_model_name}.lock` in the checkpoint directory,
flocked by one run at a time, so that a second run never writes (or cleans up) the same names."""

from __future__ import annotations

import errno
import fcntl
import os

from resnet50_trainer.checkpoint.files import SUFFIX
from resnet50_trainer.errors import UserError


class CheckpointLock:
    """This run's hold on its checkpoint names: an open descriptor with a flock, released by
    release() or, for a crashed run, by the kernel when the process dies. Forked input processes
    close their copy, so that ones outliving a killed run do not keep its lock."""

    def __init__(self, descriptor: int):
        self.descriptor: int | None = descriptor
        os.register_at_fork(after_in_child=self.release)

    def release(self) -> None:
        if self.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = None


def lock_checkpoints(directory: str, name: str) -> CheckpointLock:
    """Lock this name's checkpoints in `directory` for this run. The file itself is never deleted
    (that would race with a run opening it)."""
    path = os.path.join(directory, f".{name}.lock")
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)  # read-only: no write-open file
    except OSError as error:
        raise UserError(
            f"cannot create the lock file {path} ({error.strerror}): choose a "
            "writable --checkpoint_dir"
        ) from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(descriptor)
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise UserError(
                f"another run is writing checkpoints {name}_*{SUFFIX} in {directory} "
                f"(it holds {path}): wait for it to end, or give this run another "
                "--checkpoint_dir or --save_model_name"
            ) from None
        raise UserError(
            f"cannot lock {path} ({error.strerror}): choose a --checkpoint_dir on a "
            "file system with file locks"
        ) from None
    return CheckpointLock(descriptor)
