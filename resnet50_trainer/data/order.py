"""Which records each process reads, and in what order.

The run reads one global stream of records: pass k over the DB is a permutation seeded by
(seed, k). Every epoch starts at a fresh pass; step s of an epoch takes the next global batch of
positions and process r takes its own slice of it. So no record is read twice in an epoch across
all processes (while an epoch is at most one pass), the order changes every epoch, and the order
is a function of (seed, epoch, step) alone: a resume, on any number of processes, reads exactly
what an uninterrupted run would have.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler


class RecordOrder:
    """The global stream: position p reads record permutation[p // N][p % N]."""

    def __init__(self, num_records: int, seed: int):
        self.num_records = num_records
        self.seed = seed
        self._pass = -1
        self._permutation = np.empty(0, dtype=np.int64)

    def records_at(self, positions: range) -> list[int]:
        return [self._record_at(position) for position in positions]

    def _record_at(self, position: int) -> int:
        pass_index, offset = divmod(position, self.num_records)
        if pass_index != self._pass:
            self._permutation = np.random.default_rng([self.seed, pass_index]).permutation(
                self.num_records
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

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        """Epochs count from 0; start_step > 0 continues an epoch cut short by a checkpoint."""
        self.epoch = epoch
        self.start_step = start_step

    def __len__(self) -> int:
        return self.steps_per_epoch - self.start_step

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        epoch_start = self.epoch * self.positions_per_epoch
        for step in range(self.start_step, self.steps_per_epoch):
            first = epoch_start + step * self.global_batch + self.rank * self.device_batch
            positions = range(first, first + self.device_batch)
            yield list(zip(positions, self.order.records_at(positions)))


def evaluation_batches(
    num_records: int, batch_size: int, rank: int, world_size: int
) -> list[list[int]]:
    """Each process's share of the whole test DB: every record exactly once across processes."""
    mine = list(range(rank, num_records, world_size))
    return [mine[i : i + batch_size] for i in range(0, len(mine), batch_size)]
