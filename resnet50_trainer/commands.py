"""How every command runs and ends: its body, then one line and an exit status on what ends it
(errors.ONE_LINE_ERRORS, a limit of the machine, Ctrl-C). Torch-free."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from resnet50_trainer.errors import (
    FAILURE_EXIT_STATUS,
    INTERRUPTED_EXIT_STATUS,
    ONE_LINE_ERRORS,
    error_line,
    exit_status,
)
from resnet50_trainer.limits import shortage_in
from resnet50_trainer.streams import guard_standard_streams


def report(prog: str, error: Exception) -> int:
    """Print one of ONE_LINE_ERRORS as its one line; return its exit status."""
    print(error_line(prog, error), file=sys.stderr)
    return exit_status(error)


def run_command(prog: str, body: Callable[[], int | None]) -> int:
    """Every command's main: run `body` and return its exit status (None is 0), or end on one of
    ONE_LINE_ERRORS, a limit of the machine (limits.py: exit 1) or Ctrl-C in one line. Its
    standard streams guarded (guard_standard_streams), named `prog`."""
    guard_standard_streams(prog)
    if current_folder_gone():
        # Its paths are absolute (config.values.path_value refuses a relative one then), and
        # torch's oneMKL cannot load torch from a folder that is gone.
        os.chdir("/")
    try:
        status = body()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return INTERRUPTED_EXIT_STATUS
    except ONE_LINE_ERRORS as error:
        return report(prog, error)
    except (OSError, RuntimeError, MemoryError, ImportError) as error:
        shortage = shortage_in(error)
        if shortage is None:
            raise
        print(error_line(prog, shortage), file=sys.stderr)
        return FAILURE_EXIT_STATUS
    return status or 0


def current_folder_gone() -> bool:
    """Whether this process stands in a folder that was removed (cd into it, remove it, run)."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False
