"""A scheduler's stop signal (lifecycle.PREEMPT_SIGNALS) to any process of the run, or to all at
once: each training process only records it here; the epoch loop folds "did a signal come" into
its next check all-reduce, so every process learns it at the same step, saves that position and
stops (exit errors.PREEMPTED_EXIT_STATUS). Recording, not raising: a signal never breaks into a
collective or a checkpoint being written, and a second one changes nothing."""

from __future__ import annotations

import signal

from resnet50_trainer.lifecycle import PREEMPT_SIGNALS

_received: list[int] = []


def record_stop_signals() -> None:
    """From now on a stop signal to this process is recorded, not acted on."""

    def record(signum, frame):
        _received.append(signum)

    for signum in PREEMPT_SIGNALS:
        signal.signal(signum, record)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PREEMPT_SIGNALS)  # see preempt_signals_blocked


def stop_signal() -> int | None:
    """The first stop signal this process received, or None."""
    return _received[0] if _received else None


def stop_signal_name() -> str:
    """The first stop signal this process received, by name, as the one-line reports say it; a
    process that received none stops on its peers' agreement."""
    received = stop_signal()
    return "a stop signal to another process" if received is None else signal.Signals(received).name
