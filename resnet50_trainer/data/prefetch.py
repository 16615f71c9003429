"""Batches onto the training device, the next one copied while the current one trains.

On a GPU, a side CUDA stream runs `stage` (the pinned host->device copy, or the GPU decoder) for
batch k+1 while the default stream computes batch k (queued just before); the default stream waits
for the side stream only when it takes the batch. The GPU decoder waits for the side stream (not the
default one) to be idle before nvJPEG writes (data/gpu_decode.py). On the CPU there is nothing to
overlap: batches pass through `stage`.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import record_function
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

from resnet50_trainer.data.batch import Batch, require_records
from resnet50_trainer.data.spans import COPY_TO_DEVICE, WAIT_FOR_BATCH
from resnet50_trainer.errors import ONE_LINE_ERRORS, PeerLost
from resnet50_trainer.lifecycle import end_input_processes, preempt_signals_blocked

_END = object()  # of a pass's batches
TICK_S = 1.0  # the longest tick of the clock that times a wait for a batch (_deadline)


@dataclass(frozen=True)
class BatchWaits:
    """How long a training process waits for a batch from its input processes: `first_s` for a
    loader's first, `later_s` for every later one (then PeerLost); once `stopping()` (a stop
    signal came), `stop_after_s` more at most (then StopWhileWaiting). Seconds of this process's
    running time, to within a tick (_deadline)."""

    first_s: float
    later_s: float
    stopping: Callable[[], bool]
    stop_after_s: float


class StopWhileWaiting(Exception):
    """A stop signal came while this process waited for a batch, and none came within
    BatchWaits.stop_after_s: an input process is stopped or stuck (or the storage stopped
    answering), and the run must stop without it. `waited_s`: how long the wait had lasted."""

    def __init__(self, waited_s: float):
        super().__init__(f"no batch came in {waited_s:g} s after a stop signal")
        self.waited_s = waited_s


class DevicePrefetcher:
    """Iterable of device Batches made from `batches` by `stage`, one batch ahead on CUDA.

    A batch in which every record failed stops training (require_records); evaluation
    (`allow_empty`) gets it empty, with its bad keys, and counts them. With `waits`, a batch that
    takes longer raises PeerLost, or StopWhileWaiting after a stop signal, where SIGALRM is free
    to time it (_alarm_is_free). The wait for each batch and its stage are spans of a profile's
    trace."""

    def __init__(
        self,
        batches: DataLoader,
        device: torch.device,
        stage: Callable[[Any], Batch],
        allow_empty: bool = False,
        waits: BatchWaits | None = None,
        stage_span: str = COPY_TO_DEVICE,
    ):
        self.batches, self.device, self.stage = batches, device, stage
        self.stage_span = stage_span  # what a profile's trace calls the stage (data/spans.py)
        self.allow_empty, self.waits = allow_empty, waits
        self._first_taken = False

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Batch]:
        # Input processes start here (see ignore_stop_signals); a later pass waits here for theirs
        # to begin (a loader's persistent input processes each answer).
        with preempt_signals_blocked(), self._waiting():
            started = _started(self.batches)
        iterator = _their_own_lines(started)
        if self.waits is not None:
            iterator = self._in_time(iterator)
        iterator = _each_wait_marked(iterator)
        if self.device.type != "cuda":
            return (self._staged(batch) for batch in iterator)
        return self._overlapped(iterator)

    @contextlib.contextmanager
    def _waiting(self) -> Iterator[None]:
        waits = self.waits
        if waits is None or not _alarm_is_free():
            yield
            return
        try:
            with _deadline(waits.later_s if self._first_taken else waits.first_s, waits):
                yield
        except StopWhileWaiting:
            # One is stuck, and the run stops: ended now, together, where the loader's shutdown
            # would wait 5 s for each in turn.
            end_input_processes()
            raise

    def _in_time(self, batches: Iterator) -> Iterator:
        while True:
            with self._waiting():
                batch = next(batches, _END)
            if batch is _END:
                return
            self._first_taken = True
            yield batch

    def _overlapped(self, iterator: Iterator) -> Iterator[Batch]:
        side = torch.cuda.Stream(self.device)
        compute = torch.cuda.current_stream(self.device)
        ready = self._load(iterator, side)
        while ready is not None:
            compute.wait_stream(side)
            for tensor in (ready.images, ready.labels):
                # Made on the side stream, used on the compute stream: keep the allocator from
                # handing the memory back to the side stream while compute still reads it.
                tensor.record_stream(compute)
            yield ready  # the caller queues this step's work before the next copy is queued
            ready = self._load(iterator, side)

    def _load(self, iterator: Iterator, side: torch.cuda.Stream) -> Batch | None:
        try:
            batch = next(iterator)
        except StopIteration:
            return None
        with torch.cuda.stream(side):
            return self._staged(batch)

    def _staged(self, batch) -> Batch:
        with record_function(self.stage_span):
            staged = self.stage(batch)
        # After the stage: the GPU decoder may find every JPEG of a batch bad too.
        return staged if self.allow_empty else require_records(staged)


def _each_wait_marked(batches: Iterator) -> Iterator:
    while True:
        with record_function(WAIT_FOR_BATCH):
            batch = next(batches, _END)
        if batch is _END:
            return
        yield batch


def _started(loader: DataLoader) -> Iterator:
    """iter(loader); where its start fails part way (an input process or a queue not made: a
    limit of the machine, limits.py), the half-made iterator is marked shut down, or its __del__
    would fail on what its __init__ never made, a traceback printed after the run's line. Input
    processes it did start are ended with the others (lifecycle.end_input_processes)."""
    try:
        return iter(loader)
    except BaseException as error:
        for frame, _ in traceback.walk_tb(error.__traceback__):
            made = frame.f_locals.get("self")
            if isinstance(made, _MultiProcessingDataLoaderIter):
                made._shutdown = True
        raise


def _their_own_lines(batches: Iterator) -> Iterator:
    """`batches`, and a one-line error (errors.py) raised in an input process raised again with
    its own line: the DataLoader re-raises it as its type with torch's message ("Caught UserError
    in DataLoader worker process 0.", then the traceback, whose last line is "module.Type:
    message")."""
    try:
        yield from batches
    except ONE_LINE_ERRORS as error:
        lines = str(error).splitlines()
        if len(lines) < 2:  # raised in this process (no input processes)
            raise
        raise type(error)(lines[-1].split(": ", 1)[-1]) from error


@contextlib.contextmanager
def _deadline(seconds: float, waits: BatchWaits) -> Iterator[None]:
    """PeerLost if the body takes longer than `seconds`; StopWhileWaiting once it has gone on
    waits.stop_after_s after waits.stopping() turned true. Not the DataLoader's own timeout: with
    one, it blocks in a single wait of that length instead of checking every 5 s that its input
    processes live (one that exits went unnoticed until the timeout); and a stopped or stuck
    input process lives, so without one a run of one process waited for it without end.

    Timed in ticks of SIGALRM, TICK_S at most: the ticks due while the whole job was stopped
    (Ctrl-Z, SIGSTOP) come as one signal when it is continued, so the wait counts the time this
    process ran, to within a tick. Timed by the wall clock, a job stopped longer than the limit
    failed as it was continued (fg), blaming its input processes. The ticks go on after the
    limit: raised while a __del__ or a weakref callback runs, the error is only printed."""
    ticks = math.ceil(seconds / TICK_S)
    tick_s = seconds / ticks
    counted = 0
    stopping_at: int | None = None  # the tick at which waits.stopping() was first seen

    def tick(signum: int, frame: object) -> None:
        nonlocal counted, stopping_at
        counted += 1
        if stopping_at is None and waits.stopping():
            stopping_at = counted
        if stopping_at is not None and (counted - stopping_at) * tick_s >= waits.stop_after_s:
            raise StopWhileWaiting(counted * tick_s)
        if counted >= ticks:
            raise PeerLost(
                f"no batch came from its input (DataLoader) processes in {seconds:g} s: one is "
                "stopped or stuck, or the storage stopped answering (--first_iter_timeout is the "
                "limit for the first batch, --timeout for each later one)"
            )

    previous = signal.signal(signal.SIGALRM, tick)
    signal.setitimer(signal.ITIMER_REAL, tick_s, tick_s)
    try:
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:  # again, where the alarm raised in the first finally: the next is a second away
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _alarm_is_free() -> bool:
    """Whether this thread may time a wait with SIGALRM: the main thread (the one where Python
    runs signal handlers), no timer of someone else's running, no handler set from C (which
    could not be put back)."""
    return (
        threading.current_thread() is threading.main_thread()
        and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        and signal.getsignal(signal.SIGALRM) is not None
    )
