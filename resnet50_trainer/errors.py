"""What can end a command, typed by what happened, and its exit status: the one line a command
ends on ("<prog>: error: <message>", error_line); anything else is a bug and keeps its traceback.
How every command runs to that end is commands.py; how a run's processes end, lifecycle.py.
Torch-free: the command lines report with it before torch is imported."""

from __future__ import annotations

import signal

TRAINER = "resnet50-trainer"  # the trainer's name in its one-line reports
FAILURE_EXIT_STATUS = 1
USAGE_EXIT_STATUS = 2
INTERRUPTED_EXIT_STATUS = 130  # 128 + SIGINT, as a shell reports Ctrl-C
# A signal made the run save its exact position and stop: a job script requeues on it and
# restarts with --auto_resume. Distinct from success, a failed run and bad input.
PREEMPTED_EXIT_STATUS = 3
# The reader of a command's output left (`| head`): the status a shell reports for `cat` then,
# which SIGPIPE ended (128 + 13).
OUTPUT_CLOSED_EXIT_STATUS = 128 + signal.SIGPIPE


class UserError(Exception):
    """Bad input from the user (flags, paths, databases, services).

    The message is one line naming the problem and the fix."""


class RecordError(Exception):
    """A database record that cannot be parsed or decoded: the data's fault, not the command
    line's. Training skips and counts such records; a command asked about one reports it."""


class Diverged(Exception):
    """The run's loss or weights became non-finite; the message is one line."""


class PeerLost(Exception):
    """This process waited on its peers and one died, hung past the timeout or became unreachable;
    or on its input processes, for a batch, past the timeout. The message is one line: what was
    being waited on, and the reason (the backend's, with the peer's address where Gloo gives it)."""


class RunFailed(Exception):
    """The run lost a training process's peer or its input processes; the message is one line."""


class Preempted(Exception):
    """A signal stopped the run at a step boundary, after its position was saved; the message is
    one line naming the checkpoint and how to resume."""


# The errors a command ends on in one line, and its exit status for each: bad input (the flags,
# the data) is 2, as argparse's refusals; a run that started and could not go on is 1.
EXIT_STATUS: dict[type[Exception], int] = {
    UserError: USAGE_EXIT_STATUS,
    RecordError: USAGE_EXIT_STATUS,
    Diverged: FAILURE_EXIT_STATUS,
    PeerLost: FAILURE_EXIT_STATUS,
    RunFailed: FAILURE_EXIT_STATUS,
    Preempted: PREEMPTED_EXIT_STATUS,
}
ONE_LINE_ERRORS = tuple(EXIT_STATUS)


def error_line(prog: str, message: object) -> str:
    """One line, whatever `message` holds: a character that would end it or drive the terminal (a
    newline, an escape) is written escaped, as `shown` writes it in a path."""
    text = "".join(char if char.isprintable() else escaped(char) for char in str(message))
    return f"{prog}: error: {text}"


_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\v": "\\v",
    "\f": "\\f",
    "\r": "\\r",
}


def escaped(char: str) -> str:
    """An unprintable character as a shell's $'...' writes it: a C escape, or its bytes in octal
    (a surrogate from dc80 to dcff stands for the one byte the OS gave, as os.fsdecode makes it)."""
    if char in _ESCAPES:
        return _ESCAPES[char]
    data = (
        bytes([ord(char) - 0xDC00])
        if "\udc80" <= char <= "\udcff"
        else char.encode("utf-8", "surrogatepass")
    )
    return "".join(f"\\{byte:03o}" for byte in data)


def exit_status(error: Exception) -> int:
    """The exit status a command ends with on one of ONE_LINE_ERRORS."""
    return next(status for kind, status in EXIT_STATUS.items() if isinstance(error, kind))
