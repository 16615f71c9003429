"""Which records each process reads, and in what order.

The run reads one global stream of records: pass k over the DB is a permutation seeded by
(seed, k). Every epoch starts at a fresh pass; step s of an epoch takes the next global batch of
positions and process r takes its own slice of it. So no record is read twice in an epoch across
all processes (while an epoch is at most one pass), the order changes every epoch, and the order
is a function of (seed, epoch, step) alone: a resume, on any number of processes, reads exactly
what an uninterrupted run would have.

A pass is random (every record anywhere) or quasi-random, for a DB that does not fit in memory:
runs of `run_length` consecutive records in a random order of runs, the records shuffled within
windows of `window_runs` runs, so that storage serves whole runs with one large read each while a
batch still draws from many places of the DB (FFCV's QUASI_RANDOM, WebDataset's shuffle buffer).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler


def quasi_random_permutation(
    num_records: int, run_length: int, window_runs: int, rng: np.random.Generator
) -> np.ndarray:
    """Every record once: runs of `run_length` consecutive records (the DB's last run may be
    shorter) in a random order, the records shuffled within each window of `window_runs` runs."""
    starts = rng.permutation(math.ceil(num_records / run_length)) * run_length
    records = (starts[:, None] + np.arange(run_length)[None, :]).ravel()
    records = records[records < num_records]
    run_ends = np.cumsum(np.minimum(run_length, num_records - starts))
    window_ends = [*run_ends[window_runs - 1 :: window_runs].tolist(), num_records]
    window_start = 0
    for window_end in window_ends:
        rng.shuffle(records[window_start:window_end])  # in place: a view of `records`
        window_start = window_end
    return records


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


class ShardBatchSampler(Sampler):
    """This process's (position, record index) pairs, one list per step of the current epoch."""

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

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        epoch_start, order = self.epoch * self.positions_per_epoch, self.epoch_order
        for step in range(self.start_step, self.steps_per_epoch):
            first = epoch_start + step * self.global_batch + self.rank * self.device_batch
            positions = range(first, first + self.device_batch)
            yield list(zip(positions, order.records_at(positions)))


def evaluation_batches(
    num_records: int, batch_size: int, rank: int, world_size: int
) -> list[list[int]]:
    """Each process's share of the whole test DB: every record exactly once across processes."""
    mine = list(range(rank, num_records, world_size))
    return [mine[i : i + batch_size] for i in range(0, len(mine), batch_size)]
