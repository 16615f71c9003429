"""What can end a command, typed by what happened, and the one way every command ends on it: one
line on stderr ("<prog>: error: <message>") and an exit status; anything else is a bug and keeps
its traceback. Where a command's lines go (its standard streams, whatever they are, and its log
records). Torch-free: the command lines report with it before torch is imported."""

from __future__ import annotations

import atexit
import errno
import itertools
import logging
import os
import re
import signal
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn, TextIO, cast

from resnet50_trainer.limits import remove_shared_memory_of, shortage_in

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
# What a scheduler sends before it kills a job (Slurm's scancel and preemption, Kubernetes'
# eviction: SIGTERM; Slurm's --signal=USR1@N early warning), and what a terminal sends its jobs as
# it closes (SIGHUP: a run started without nohup): the run saves and stops on any of them.
PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)


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


@contextmanager
def preempt_signals_blocked(*others: signal.Signals) -> Iterator[None]:
    """Stop signals (and `others`) held pending while processes are started: a child inherits
    the mask (across exec too) and unblocks them once it has set what they do to it, so a signal
    to the whole process group in between neither kills it nor is lost."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, (*PREEMPT_SIGNALS, *others))
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def error_line(prog: str, message: object) -> str:
    """One line, whatever `message` holds: a character that would end it or drive the terminal (a
    newline, an escape) is written escaped, as `shown` writes it in a path."""
    text = "".join(char if char.isprintable() else _escaped(char) for char in str(message))
    return f"{prog}: error: {text}"


# A path made only of these shows as it is, as ls leaves such a name unquoted; any other
# printable character has it quoted.
_PLAIN_PATH = re.compile(r"[\w@%+=:,./-]+")
_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\v": "\\v",
    "\f": "\\f",
    "\r": "\\r",
}


def shown(path: str | bytes) -> str:
    """`path` as a one-line message shows it, quoted as ls quotes a name for a shell: plain where
    nothing in it needs quotes, else in '...', with a control character or a byte that is not
    UTF-8 (surrogateescape, as Python gives a path the OS returns) as $'\\n', $'\\033', $'\\377'.
    A path holding a newline or a terminal escape can then neither split a report nor drive the
    terminal, and what is shown pastes back into a shell as the same path."""
    text = os.fsdecode(path)
    if _PLAIN_PATH.fullmatch(text):
        return text
    quoted = [
        "'" + "".join(run).replace("'", "'\\''") + "'"
        if printable
        else "$'" + "".join(map(_escaped, run)) + "'"
        for printable, run in itertools.groupby(text, str.isprintable)
    ]
    return "".join(quoted) or "''"


def _escaped(char: str) -> str:
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


def unreachable(path: str) -> str | None:
    """Why `path` cannot be looked up, where the system refuses it rather than finding nothing:
    the folder on its way this user may not enter, a link that leads back to itself, a file
    where a folder should be; in words and with the fix. None where it is there or simply
    missing."""
    try:
        os.stat(path)
        return None
    except FileNotFoundError:
        return None
    except OSError as error:
        failure, reason = error.errno, error.strerror
    failing = _first_failing_prefix(path, failure)
    if failure == errno.EACCES:
        return denied("enter", os.path.dirname(failing))
    if failure == errno.ELOOP:
        return (
            f"{shown(failing)} is a symbolic link that leads back to itself: point it at a "
            "real file or folder"
        )
    if failure == errno.ENOTDIR:
        on_the_way = _file_on_the_way(failing)
        what = "a file, not a folder" if os.path.isfile(on_the_way) else "not a folder"
        return f"{shown(on_the_way)} is {what}: correct the path"
    return f"{reason}: check the path"


def check_reachable(what: str, path: str) -> None:
    """UserError naming `what` (a flag, "database") and why, where `path` is unreachable."""
    reason = unreachable(path)
    if reason:
        raise UserError(f"{what} {shown(path)} cannot be reached: {reason}")


def _first_failing_prefix(path: str, failure: int | None) -> str:
    """The shortest leading part of `path` whose lookup fails as the whole path's did."""
    parts = os.path.normpath(path).split(os.sep)
    for end in range(1, len(parts) + 1):
        prefix = os.sep.join(parts[:end]) or os.sep
        try:
            os.stat(prefix)
        except OSError as error:
            if error.errno == failure:
                return prefix
    return path


def _file_on_the_way(prefix: str) -> str:
    """The part of `prefix` (whose lookup says "not a directory") that is no folder: a file, a
    device, a FIFO."""
    while prefix and not (os.path.exists(prefix) and not os.path.isdir(prefix)):
        parent = os.path.dirname(prefix)
        if parent == prefix:  # the root: nothing on the way
            break
        prefix = parent
    return prefix or "."


ACCESS_FIX = "ask its owner for access, or run as a user who has it"


def denied(verb: str, path: str, fix: bool = True) -> str:
    """Permission denied, in words: this user may not `verb` (enter, read, write) `path`, whose
    owner and mode say why; and the fix (ACCESS_FIX) unless the caller says it."""
    try:
        info = os.stat(path)
        whose = f" (owner {_user_name(info.st_uid)}, mode {stat.S_IMODE(info.st_mode):o})"
    except OSError:
        whose = ""
    return (
        f"permission denied: user {_user_name(os.geteuid())} may not {verb} {shown(path)}"
        f"{whose}{f': {ACCESS_FIX}' if fix else ''}"
    )


def _user_name(uid: int) -> str:
    import pwd  # only for this report

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def exit_status(error: Exception) -> int:
    """The exit status a command ends with on one of ONE_LINE_ERRORS."""
    return next(status for kind, status in EXIT_STATUS.items() if isinstance(error, kind))


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


def leave(status: int) -> NoReturn:
    """End this training process with `status`: its exit handlers run and its output is flushed,
    but the interpreter is not torn down. A thread of torch's Gloo process group may still be
    freeing a finished collective then, which takes the GIL; during teardown the interpreter ends
    that thread inside a C++ destructor and the process aborts ("terminate called without an
    active exception", SIGABRT) after the run has reported its outcome (pytorch/pytorch#179291).
    Input processes are ended by multiprocessing's exit handler (end_input_processes_at_exit)."""
    atexit._run_exitfuncs()  # multiprocessing's, logging's, tqdm's
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def end_input_processes_at_exit() -> None:
    """However this process ends (a return from main, an exception, a test session's end), its
    input processes are ended first: multiprocessing's exit would SIGTERM them (they ignore it)
    and wait for them forever. A finalizer of multiprocessing's own, not an atexit handler: its
    exit runs these before it SIGTERMs its daemonic children, whatever the atexit order, and in
    a process that multiprocessing started too (which runs that exit without atexit)."""
    global _ENDING_REGISTERED_IN
    if _ENDING_REGISTERED_IN != os.getpid():  # a forked child inherits the flag, not the finalizer
        import multiprocessing.util

        multiprocessing.util.Finalize(None, end_input_processes, exitpriority=_ENDING_PRIORITY)
        _ENDING_REGISTERED_IN = os.getpid()


_ENDING_REGISTERED_IN: int | None = None
_ENDING_PRIORITY = 100  # before the finalizers of priority 0 (the LevelDB snapshots)
# What the process that started an input process sends it to end it now, cleanly: its exit
# finalizers run (its LevelDB snapshot is removed). Not a stop signal any scheduler sends.
END_SIGNAL = signal.SIGUSR2
END_GRACE_S = 3.0  # then SIGKILL: an input process stuck in its exit must not hold this one


def stop_watching_input_processes() -> None:
    """Set aside torch's SIGCHLD handler: when an input process ends it raises wherever this
    thread is, which is right while batches are awaited and wrong once the run ends or handles its
    own error (a second error, with a traceback). A handler that does nothing, not SIG_DFL: a
    SIGCHLD received but not yet handled then runs it, not a 'Signal 17 ignored' warning. Torch
    sets its handler once a process: a later run in this process (cli.main called again) notices
    a dead input process by the DataLoader's own check, within 5 s, in other words."""
    signal.signal(signal.SIGCHLD, _ignore)


def _ignore(signum: int, frame: object) -> None:
    pass


def input_processes() -> list:
    """This process's input processes: its daemonic children (multiprocessing.Process)."""
    import multiprocessing  # torch-free, and only where they are looked for

    return [child for child in multiprocessing.active_children() if child.daemon]


def end_input_processes() -> None:
    """Input processes (the daemonic children) ignore stop signals: multiprocessing's exit would
    SIGTERM them and then wait forever. Their parent ends them with END_SIGNAL, all at once, and
    SIGKILL after END_GRACE_S; torch's SIGCHLD handler, which would report them as lost input
    processes, is set aside first. What they left in /dev/shm is removed once they have ended
    (an allocation that failed there keeps its name). At exit (end_input_processes_at_exit), or
    sooner."""
    import time

    stop_watching_input_processes()
    daemons = input_processes()
    for child in daemons:
        if child.pid is not None:
            try:
                os.kill(child.pid, END_SIGNAL)
                os.kill(child.pid, signal.SIGCONT)  # a stopped one takes END_SIGNAL only then
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + END_GRACE_S
    for child in daemons:
        child.join(max(0.0, deadline - time.monotonic()))
    for child in daemons:
        if child.is_alive():
            child.kill()
            child.join()
    remove_shared_memory_of(child.pid for child in daemons if child.pid is not None)


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
    closed = [fd for fd in (0, 1, 2) if not _is_open(fd)]
    for fd in closed:
        _become_null(fd)


def _become_null(fd: int) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    if null != fd:  # it took the lowest number free, which may be the closed one itself
        os.dup2(null, fd)
        os.close(null)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
