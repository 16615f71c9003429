"""Which records each process reads, and in what order.

The run reads one global stream of records: pass k over the DB is a permutation seeded by
(seed, k). Every epoch starts at a fresh pass; step s of an epoch takes the next global batch of
positions and process r takes its own slice of it. So no record is read twice in an epoch across
all processes (while an epoch is at most one pass), the order changes every epoch, and the order
is a function of (seed, epoch, step) alone: a resume, on any number of processes, reads exactly
what an uninterrupted run would have.

A pass is random (every record anywhere) or quasi-random, for a DB that does not fit in memory:
runs of `run_length` consecutive records, the records shuffled within windows of `window_runs`
runs spread evenly over the DB, so that storage serves whole runs with one large read each while a
batch still draws from many places of the DB (FFCV's QUASI_RANDOM, WebDataset's shuffle buffer).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
from torch.utils.data import Sampler


def quasi_random_permutation(
    num_records: int, run_length: int, window_runs: int, rng: np.random.Generator
) -> np.ndarray:
    """Every record once: runs of `run_length` consecutive records (the DB's last run may be
    shorter) in windows of at most `window_runs` runs, the windows in a random order and each
    one's records shuffled together. A window takes one run, at random, from each stretch of as
    many consecutive runs as there are windows: its runs spread evenly over the DB, so in a DB in
    label order each window holds each label in its share. (Windows of runs drawn anywhere held
    shares that drifted from the DB's for all of a window's batches, which cost test accuracy:
    docs/data.md.)"""
    runs = math.ceil(num_records / run_length)
    windows = math.ceil(runs / window_runs)
    stretches = math.ceil(runs / windows)
    # Row s: stretch s's runs, shuffled; column w: the runs of window w.
    grid = np.argsort(rng.random((stretches, windows)), axis=1)
    grid += np.arange(stretches)[:, None] * windows
    passes = []
    for window in rng.permutation(windows):
        starts = grid[:, window]
        starts = starts[starts < runs] * run_length
        records = (starts[:, None] + np.arange(run_length)[None, :]).ravel()
        records = records[records < num_records]
        rng.shuffle(records)
        passes.append(records)
    return np.concatenate(passes)


class RecordOrder:
    """The global stream: position p reads record permutation[p // N][p % N]. `run_length` 1 is
    random order (the permutation every version of the trainer drew); more, quasi-random."""

    def __init__(self, num_records: int, seed: int, run_length: int = 1, window_runs: int = 1):
        self.num_records = num_records
        self.seed = seed
        self.run_length = max(1, min(run_length, num_records))
        self.window_runs = max(1, window_runs) if self.run_length > 1 else 1
        self._pass = -1
        self._permutation = np.empty(0, dtype=np.int64)

    def records_at(self, positions: range) -> list[int]:
        return [self._record_at(position) for position in positions]

    @property
    def shape(self) -> tuple[int, int]:
        """(run_length, window_runs), as ReadOrder.shape and a checkpoint record them."""
        return self.run_length, self.window_runs

    def _record_at(self, position: int) -> int:
        pass_index, offset = divmod(position, self.num_records)
        if pass_index != self._pass:
            rng = np.random.default_rng([self.seed, pass_index])
            if self.run_length == 1:
                self._permutation = rng.permutation(self.num_records)
            else:
                self._permutation = quasi_random_permutation(
                    self.num_records, self.run_length, self.window_runs, rng
                )
            self._pass = pass_index
        return int(self._permutation[offset])


class StepReads(NamedTuple):
    """What one process reads at one step: its (stream position, record index) pairs, and, for
    the storage, the epoch's order (runs of `run_length` consecutive records, 1 in random order,
    shuffled in windows of `window_runs`) and the records of this process's next step in the
    epoch (their runs are asked for ahead)."""

    items: list[tuple[int, int]]
    run_length: int
    window_runs: int
    ahead: list[int]


class ShardBatchSampler(Sampler):
    """This process's reads (StepReads), one per step of the current epoch. They carry the
    epoch's order to the input processes, which outlive an epoch and may read the next one in
    another order (a mid-epoch resume finishes its epoch in the checkpoint's order)."""

    def __init__(
        self,
        order: RecordOrder,
        steps_per_epoch: int,
        global_batch: int,
        device_batch: int,
        rank: int,
    ):
        self.order = order
        self.steps_per_epoch = steps_per_epoch
        self.global_batch = global_batch
        self.device_batch = device_batch
        self.rank = rank
        passes = math.ceil(steps_per_epoch * global_batch / order.num_records)
        self.positions_per_epoch = passes * order.num_records
        self.epoch = 0
        self.start_step = 0
        # A mid-epoch checkpoint's epoch, and the order it began in (when not `order`).
        self.resumed: tuple[int, RecordOrder] | None = None

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Epochs count from 0; start_step > 0 continues an epoch cut short by a checkpoint."""
        self.epoch = epoch
        self.start_step = start_step

    def finish_epoch_in(self, epoch: int, run_length: int, window_runs: int) -> bool:
        """A mid-epoch checkpoint's epoch goes on in the order it began in, whatever this run's
        --read_order resolved to (the next epochs take that); True if that is another order.
        Every epoch starts at a fresh pass, so an epoch's order is its own."""
        if (run_length, window_runs) == self.order.shape:
            return False
        order = RecordOrder(self.order.num_records, self.order.seed, run_length, window_runs)
        self.resumed = epoch, order
        return True

    @property
    def epoch_order(self) -> RecordOrder:
        """The order of the current epoch."""
        if self.resumed is not None and self.resumed[0] == self.epoch:
            return self.resumed[1]
        return self.order

    @property
    def epoch_order_shape(self) -> tuple[int, int]:
        return self.epoch_order.shape

    def __len__(self) -> int:
        return self.steps_per_epoch - self.start_step

    def __iter__(self) -> Iterator[StepReads]:
        order = self.epoch_order
        ahead = self._step_records(order, self.start_step) if len(self) else []
        for step in range(self.start_step, self.steps_per_epoch):
            records = ahead
            ahead = self._step_records(order, step + 1) if step + 1 < self.steps_per_epoch else []
            items = list(zip(self._step_positions(step), records))
            yield StepReads(items, *order.shape, ahead)

    def _step_positions(self, step: int) -> range:
        epoch_start = self.epoch * self.positions_per_epoch
        first = epoch_start + step * self.global_batch + self.rank * self.device_batch
        return range(first, first + self.device_batch)

    def _step_records(self, order: RecordOrder, step: int) -> list[int]:
        return order.records_at(self._step_positions(step))


def evaluation_batches(
    num_records: int, batch_size: int, rank: int, world_size: int
) -> list[list[int]]:
    """Each process's share of the whole test DB: every record exactly once across processes."""
    mine = list(range(rank, num_records, world_size))
    return [mine[i : i + batch_size] for i in range(0, len(mine), batch_size)]
