"""Where a command's lines go: its standard streams, whatever they are (closed at the start,
a pipe whose reader left, a full disk), and its log records. Torch-free."""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections.abc import Callable
from typing import NoReturn, TextIO, cast

from resnet50_trainer.errors import FAILURE_EXIT_STATUS, OUTPUT_CLOSED_EXIT_STATUS, error_line


def log_lines(level: int, force: bool = False) -> None:
    """Log records as their bare message on stderr: this package's from `level` up, other
    libraries' from WARNING up. Torch's INFO lines are not the run's: at exit, FakeTensor's cache
    statistics, which a Ctrl-C that cut torch's import short (its logging not yet set) left to the
    root logger's level. `force`: the handlers already there replaced (basicConfig's)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s", force=force)
    logging.getLogger(__name__.split(".")[0]).setLevel(level)


def guard_standard_streams(prog: str) -> None:
    """A command's standard streams, however it was started. One closed at its start (`>&-`,
    `2>&-`) becomes /dev/null, so that no file the command opens takes its number (and the
    messages meant for it), and no write raises for want of it. A write that fails later ends as
    a command's output should: on stderr, its messages, the line is dropped and so is every later
    one (the stream becomes /dev/null) and the command goes on, its exit status unchanged (a
    reader gone, a full disk, a closed terminal); on stdout, its product, the command ends at
    once: quietly where the reader left (a closed pipe, as `cat` in `| head`, exit
    OUTPUT_CLOSED_EXIT_STATUS), else in one line on stderr, exit 1. Processes started by fork
    inherit the guard; a call after the first in a process only names the command `prog`."""
    global _guarded_prog
    _guarded_prog = prog
    _open_closed_standard_files()
    if not isinstance(sys.stdout, _StandardStream):
        stdout = sys.stdout or open(1, "w", closefd=False)  # None where fd 1 was closed at start
        sys.stdout = cast(TextIO, _StandardStream(stdout, 1, _output_lost))
    if not isinstance(sys.stderr, _StandardStream):
        stderr = sys.stderr or open(2, "w", closefd=False, errors="backslashreplace")
        sys.stderr = cast(TextIO, _StandardStream(stderr, 2, _messages_lost))


_guarded_prog = ""


class _StandardStream:
    """sys.stdout or sys.stderr (`stream`, on file descriptor `fd`) whose failed write or flush
    calls `failed` with the error once that descriptor is /dev/null. Every write is flushed: a
    failure shows where it happens, never in the interpreter's exit (an 'Exception ignored')."""

    def __init__(self, stream: TextIO, fd: int, failed: Callable[[OSError], None]):
        self._stream, self._fd, self._failed = stream, fd, failed

    def write(self, text: str) -> int:
        try:
            written = self._stream.write(text)
            self._stream.flush()
        except OSError as error:
            self._lost(error)
            return len(text)
        return written

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as error:
            self._lost(error)

    def _lost(self, error: OSError) -> None:
        _become_null(self._fd)
        self._failed(error)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


def _messages_lost(error: OSError) -> None:
    pass  # nowhere left to say so


def _output_lost(error: OSError) -> NoReturn:
    if error.errno == errno.EPIPE:
        raise SystemExit(OUTPUT_CLOSED_EXIT_STATUS)
    where = "free space where it goes" if error.errno == errno.ENOSPC else "send it elsewhere"
    print(
        error_line(
            _guarded_prog,
            f"cannot write to standard output ({error.strerror}): the output is incomplete; "
            f"{where}",
        ),
        file=sys.stderr,
    )
    raise SystemExit(FAILURE_EXIT_STATUS)


def _open_closed_standard_files() -> None:
    closed = [fd for fd in (0, 1, 2) if not is_open(fd)]
    for fd in closed:
        _become_null(fd)


def _become_null(fd: int) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:  # it took the lowest number free, which may be the closed one itself
        os.dup2(null, fd)
        os.close(null)


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
