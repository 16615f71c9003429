"""A file a command writes whole (resnet50-plot's figure, resnet50-export's model): written under a
new name beside the file its path names and renamed over it once complete, so that a file already
there stays whole until then (a full disk, an interrupt, a failed check). A path that is a symbolic
link is written through: the file it names is replaced and the link stays. A device, a FIFO or a
socket (/dev/stdout, a named pipe) is never replaced: the complete contents are copied into it."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from resnet50_trainer.errors import UserError
from resnet50_trainer.path_words import check_reachable, shown


@contextmanager
def replacing(output: str, flag: str, needs: str) -> Iterator[str]:
    """The path of a new empty file to write `output`'s contents in; they take `output`'s place
    when the block ends without an error, and are removed otherwise. UserError, naming `flag` and
    what the write `needs` (room for a model...), where `output` is a directory, cannot be looked
    up, or the file cannot be made, written (the block's OSError) or put in place."""
    check_reachable(flag, output)
    if os.path.isdir(output):
        raise UserError(
            f"{flag} {shown(output)} is a directory: give the path of the file to write"
        )
    stream = os.path.exists(output) and not stat.S_ISREG(os.stat(output).st_mode)
    destination = output if stream else os.path.realpath(output)
    temporary = None
    try:
        temporary = _new_file(None if stream else os.path.dirname(destination), destination)
        yield temporary
        if stream:
            with open(temporary, "rb") as contents, open(destination, "wb") as device:
                shutil.copyfileobj(contents, device)
        else:
            os.replace(temporary, destination)
            temporary = None
    except OSError as error:
        raise UserError(
            f"{flag} {shown(output)} cannot be written ({error.strerror or error}): choose a "
            f"writable path with {needs}"
        ) from None
    finally:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)


def _new_file(directory: str | None, destination: str) -> str:
    """A new empty file in `directory` (the temporary folder where None), named after
    `destination`; with the mode a new file gets (mkstemp's is private to its owner)."""
    name = f".{os.path.basename(destination)}.{secrets.token_hex(4)}.partial"
    path = os.path.join(directory if directory is not None else tempfile.gettempdir(), name)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    return path
