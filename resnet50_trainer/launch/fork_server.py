"""The first thing the fork server of a run's training processes does (launch/processes.py's
_start_fork_server preloads this module there; nothing else imports it): make it end with the
launcher.

CPython's fork server lives on after its parent for as long as any process it forked lives (each
holds its pipe), and torch's parent-death signal in a training process names the fork server, its
parent: after kill -9 of the launcher, its training processes would train on, orphaned. Killed
with the launcher, the server takes them with it: they get SIGINT and stop as on Ctrl-C. A
launcher gone before this runs leaves the server no process yet, and it ends on its pipe's end."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1  # <sys/prctl.h>


def end_with_the_launcher() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")


end_with_the_launcher()
