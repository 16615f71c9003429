"""How a database's build stops: its stop signals recorded in the main process and acted on
between records, where CreateInterrupted unwinds the build (which removes what it made); its pool
of worker processes, which leave those signals to the main process and die with the pool."""

from __future__ import annotations

import multiprocessing
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

# Ctrl-C, a scheduler's or kill's stop, a closed terminal or ssh session, Slurm's early warning.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)


class CreateInterrupted(BaseException):
    """SIGINT or SIGTERM stopped the build; what it had written is removed. A BaseException, as
    KeyboardInterrupt, so that no `except Exception` on the way out swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopOnSignals:
    """Records STOP_SIGNALS; the build calls check() between records, which raises
    CreateInterrupted. The handler itself never raises: Python may run it inside code that
    swallows exceptions (an at-fork hook, a finalizer) or that must not be cut short (putting the
    finished database in place, removing the partial one)."""

    def __init__(self) -> None:
        self.received: int | None = None

    def check(self) -> None:
        if self.received is not None:
            raise CreateInterrupted(self.received)

    def _handle(self, signum: int, frame) -> None:
        self.received = self.received or signum

    @contextmanager
    def installed(self) -> Iterator[StopOnSignals]:
        if threading.current_thread() is not threading.main_thread():
            yield self  # signal handlers belong to the main thread; a caller's thread keeps its own
            return
        previous = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


@contextmanager
def process_pool(num_workers: int):
    """mapped(function, items): function over a list, in order, computed by a pool of processes
    when asked (stopped at once if the block ends by an exception or a signal)."""
    if num_workers <= 1:
        yield lambda function, items: map(function, items)
        return
    # Forked workers inherit our handlers, which only record a signal: a worker that got the
    # pool's SIGTERM before _worker_signals ran would live on, and the pool's join hang. So they
    # start with SIGINT and SIGTERM blocked, until _worker_signals has set their own.
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    pool = None
    try:
        pool = multiprocessing.Pool(num_workers, initializer=_worker_signals)
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)
        yield lambda function, items: pool.imap(function, items, chunksize=8)
        pool.close()  # all done: the workers exit by themselves
        pool.join()
    finally:
        if pool is not None:
            pool.terminate()  # after an error or a signal: stop them now
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)


def _worker_signals() -> None:
    """Workers leave SIGINT and SIGHUP (sent to the whole terminal group) and SIGUSR1 to the main
    process, which stops them, and die on SIGTERM, which is how the pool stops them."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_DFL if signum == signal.SIGTERM else signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
