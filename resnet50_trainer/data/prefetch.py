"""Batches onto the training device, the next one copied while the current one trains.

On a GPU, a side CUDA stream runs `stage` (the pinned host->device copy, or the GPU decoder) for
batch k+1 while the default stream computes batch k (queued just before); the default stream waits
for the side stream only when it takes the batch. The GPU decoder waits for the side stream (not the
default one) to be idle before nvJPEG writes (data/gpu_decode.py). On the CPU there is nothing to
overlap: batches pass through `stage`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from resnet50_trainer.data.batch import Batch, require_records
from resnet50_trainer.errors import ONE_LINE_ERRORS, preempt_signals_blocked


class DevicePrefetcher:
    """Iterable of device Batches made from `batches` by `stage`, one batch ahead on CUDA.

    A batch in which every record failed stops training (require_records); evaluation
    (`allow_empty`) gets it empty, with its bad keys, and counts them."""

    def __init__(
        self,
        batches: DataLoader,
        device: torch.device,
        stage: Callable[[Any], Batch],
        allow_empty: bool = False,
    ):
        self.batches, self.device, self.stage = batches, device, stage
        self.allow_empty = allow_empty

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Batch]:
        with preempt_signals_blocked():  # input processes start here (see ignore_stop_signals)
            iterator = _their_own_lines(iter(self.batches))
        if self.device.type != "cuda":
            return (self._staged(batch) for batch in iterator)
        return self._overlapped(iterator)

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
        # After the stage: the GPU decoder may find every JPEG of a batch bad too.
        staged = self.stage(batch)
        return staged if self.allow_empty else require_records(staged)


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
