"""The process a command started has no launcher of its own to see it die: killed by the
kernel's OOM killer, or crashed in native code (SIGSEGV, SIGBUS, SIGABRT...), a run of one process
ended without a line (the shell's exit status 137 alone), and so did the launcher of several,
killed as its fork server started. A small process forked from it watches it instead and says how
it died, in one line, once it is gone: a crash as Python's faulthandler writes it into the
watcher's pipe, the OOM killer by its count (machine.oom_kills). A process that ends by itself
ends its watcher first; one killed by anything else leaves it nothing to say.

Forked from what it watches, it holds no memory of its own; and forked before a training process
raises its oom_score_adj (machine.first_for_the_oom_killer) and grows, it is never the OOM
killer's choice over that process."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import select
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from resnet50_trainer import limits, machine
from resnet50_trainer.config.settings import Config
from resnet50_trainer.errors import TRAINER, error_line

# How Python's faulthandler names each fatal signal ("Fatal Python error: Segmentation fault").
_FATAL = {
    "Segmentation fault": signal.SIGSEGV,
    "Bus error": signal.SIGBUS,
    "Illegal instruction": signal.SIGILL,
    "Floating point exception": signal.SIGFPE,
    "Aborted": signal.SIGABRT,
}
# Signals the watcher ignores: those a terminal or a scheduler sends the whole job, which the run
# handles (and ends its watcher as it ends).
_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
_POLL_S = 0.2  # where pidfd_open is missing (Linux before 5.3): how often the run is looked for


@contextmanager
def watched(config: Config, who: str) -> Iterator[None]:
    """The body of this process's part of the run, with a watcher to name its death as `who`'s
    ("the launcher")."""
    oom_kills = machine.oom_kills()
    reading, writing = os.pipe()
    run = os.getpid()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _IGNORED)
    watcher = os.fork()
    if watcher == 0:
        try:
            _let_go_of_files_but(reading)
            for signum in _IGNORED:
                signal.signal(signum, signal.SIG_IGN)
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            _watch(run, who, reading, oom_kills, config)
        finally:
            os._exit(0)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    os.close(reading)
    enabled = faulthandler.is_enabled()  # -X faulthandler: on stderr again after the run
    faulthandler.enable(file=writing, all_threads=False)
    try:
        yield
    finally:
        faulthandler.disable()
        if enabled:
            faulthandler.enable()
        os.kill(watcher, signal.SIGKILL)  # it has nothing to say: stopped, even, it goes
        os.waitpid(watcher, 0)
        os.close(writing)


def _let_go_of_files_but(kept: int) -> None:
    """Close what the run had open (its checkpoints' lock with it, were the run to die first),
    but the standard streams and `kept`."""
    for descriptor in [int(name) for name in os.listdir("/proc/self/fd")]:
        if descriptor > 2 and descriptor != kept:
            with contextlib.suppress(OSError):  # the listing's own, closed already
                os.close(descriptor)


def _watch(run: int, who: str, messages: int, oom_kills: int | None, config: Config) -> NoReturn:
    said = _until_gone(run, messages)
    signum = next((number for name, number in _FATAL.items() if name.encode() in said), None)
    if signum is None and machine.oom_killed_since(oom_kills):
        signum = signal.SIGKILL
    if signum is not None:
        died = limits.death_in_words(signum, oom_kills)
        line = f"{who} (pid {run}) {died}; the run stopped: {_resume(config)}"
        os.write(2, (error_line(TRAINER, line) + "\n").encode())
    os._exit(0)


def _until_gone(run: int, messages: int) -> bytes:
    """What the run wrote to `messages` (its faulthandler's report) until it was gone."""
    try:
        gone: int | None = os.pidfd_open(run)
    except (AttributeError, OSError):  # Linux before 5.3: its parent looked for instead
        gone = None
    said = b""
    while True:
        watched = [messages] if gone is None else [messages, gone]
        ready = select.select(watched, [], [], _POLL_S if gone is None else None)[0]
        if messages in ready:
            chunk = os.read(messages, 65536)
            said += chunk
            if chunk:
                continue
            return said  # every writer closed its end: the run too
        if gone in ready or (gone is None and os.getppid() != run):
            os.set_blocking(messages, False)  # the run's input processes may still hold its end
            with contextlib.suppress(BlockingIOError):
                said += os.read(messages, 65536)
            return said


def _resume(config: Config) -> str:
    """How to go on (training_process.how_to_go_on, imported here: the watcher runs in a forked
    copy of the run, which has it already)."""
    from resnet50_trainer.launch.training_process import how_to_go_on

    return how_to_go_on(config)
