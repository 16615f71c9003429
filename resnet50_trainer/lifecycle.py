"""How a run's processes end: the stop signals held pending while processes start, a training
process's exit, and its input processes ended by it (all at once, their shared memory removed),
whatever ends it. Torch-free."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from resnet50_trainer import cpython_private
from resnet50_trainer.machine import remove_shared_memory_of

# What a scheduler sends before it kills a job (Slurm's scancel and preemption, Kubernetes'
# eviction: SIGTERM; Slurm's --signal=USR1@N early warning), and what a terminal sends its jobs as
# it closes (SIGHUP: a run started without nohup): the run saves and stops on any of them.
PREEMPT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)


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


def leave(status: int) -> NoReturn:
    """End this training process with `status`: its exit handlers run and its output is flushed,
    but the interpreter is not torn down. A thread of torch's Gloo process group may still be
    freeing a finished collective then, which takes the GIL; during teardown the interpreter ends
    that thread inside a C++ destructor and the process aborts ("terminate called without an
    active exception", SIGABRT) after the run has reported its outcome (pytorch/pytorch#179291).
    Input processes are ended by multiprocessing's exit handler (end_input_processes_at_exit)."""
    cpython_private.run_exit_handlers()  # multiprocessing's, logging's, tqdm's
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
        cpython_private.finalize_at_multiprocessing_exit(
            None, end_input_processes, exitpriority=_ENDING_PRIORITY
        )
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
