"""Waiting on this machine's training processes (our own launcher's): a stop signal passed on to
them, and, once one has failed, the others given time to report before they are ended."""

from __future__ import annotations

import multiprocessing.connection
import os
import signal
import time

from resnet50_trainer.distributed.preemption import stop_signal
from resnet50_trainer.lifecycle import PREEMPT_SIGNALS

# Seconds the others get to end by themselves once one has ended with a failure: a survivor of a
# lost peer names it after its roll call (3 s, heartbeats.py), then leaves; killed sooner, the
# run's one line would be missing.
SURVIVORS_GRACE_S = 10.0


def forward_stop_signals(processes) -> None:
    """A stop signal to this process alone reaches its training processes, which save the run's
    position and stop; sent to the process group, they get it twice, which changes nothing."""

    def forward(signum, frame):
        for process in processes:
            if process.exitcode is None:
                os.kill(process.pid, signum)

    for signum in PREEMPT_SIGNALS:
        signal.signal(signum, forward)
    received = stop_signal()
    if received is not None:  # before they were started
        forward(received, None)


def wait_for(context) -> None:
    """Until every process has ended, or one has failed and the others have had SURVIVORS_GRACE_S
    to end by themselves (after a stop signal they save and leave with its status; after a lost
    peer they report it) before they are killed; then torch's join raises the first failure.
    Not its join alone: that SIGTERMs the others at once, logging each, and may name a later
    failure than the first."""
    processes = context.processes
    while True:
        running = [process.sentinel for process in processes if process.exitcode is None]
        # Read after `running`: a process left out of it has its final status here, so processes
        # that ended together between two looks are never taken for a clean end.
        failed = [index for index, process in enumerate(processes) if process.exitcode]
        if failed:
            break
        if not running:
            return
        for ready in multiprocessing.connection.wait(running):
            # Readable once the process has closed its files, a moment before its exit status
            # can be collected (exitcode still None): collected here, waiting that moment.
            next(process for process in processes if process.sentinel == ready).join()
    # Seen ended together: one killed by a signal is the cause, the others its survivors.
    first_failed = min(failed, key=lambda index: processes[index].exitcode)
    deadline = time.monotonic() + SURVIVORS_GRACE_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.exitcode is None:
            process.kill()
            process.join()
    # The first failure alone left for the join to raise (with its traceback, if it raised one).
    context.sentinels = {processes[first_failed].sentinel: first_failed}
    context.join()
