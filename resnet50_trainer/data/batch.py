"""What a batch holds, and the rule for the places of records that failed to decode.

The rule, defined here only (`filled_order`): a batch keeps its size; the records that decoded come
first, in order, then copies of them (with their labels) in the failed records' places, whose keys
the batch names. So the first `num_real` images are real and the rest are repeats that evaluation
must not score. When every record failed the batch is empty and the training process decides
(`require_records` stops training; evaluation counts the keys): an error raised in an input
process would reach the user wrapped in that process's traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from resnet50_trainer.data.formats.records import Record
from resnet50_trainer.data.transforms import PlanFor
from resnet50_trainer.errors import UserError


class Sample(NamedTuple):
    image: torch.Tensor | None  # CHW uint8; None when the record failed
    label: int
    bad_key: bytes | None
    outside_label: int | None = None  # a training record's label outside the model's classes


class Fetched(NamedTuple):
    """One record of a batch as the reader hands it to a decode strategy's `batch`."""

    record: Record | None  # None: it could not be read or parsed (logged by the reader)
    key: bytes
    plan_for: PlanFor  # its crop, drawn from its stream position


class Batch(NamedTuple):
    images: torch.Tensor  # NCHW uint8 (channels-last memory from CpuDecode.batch)
    labels: torch.Tensor  # N int64
    bad_keys: list  # keys of the records that failed, in batch order
    # (key, label) of the batch's first training record whose label is outside the classes.
    label_outside: tuple[bytes, int] | None = None

    @property
    def num_real(self) -> int:
        """How many of the first images are decoded records; the rest are copies of them."""
        return len(self.labels) - len(self.bad_keys) if len(self.labels) else 0


class TrainingLabelOutside(Exception):
    """A training record's label is outside the model's classes: not an unreadable record but a
    DB for another --num_labels; the training loop names the fix (train/labels.py)."""

    def __init__(self, key: bytes, label: int):
        super().__init__(f"label {label} of record {key!r} outside the model's classes")
        self.key, self.label = key, label


def first_label_outside(samples: Sequence) -> tuple[bytes, int] | None:
    """(key, label) of the first of `samples` (each with bad_key and outside_label) whose label
    is outside the classes."""
    for sample in samples:
        if sample.outside_label is not None:
            return sample.bad_key, sample.outside_label
    return None


def filled_order(failed: Sequence[bool]) -> list[int]:
    """The places of a batch filled from the records that did not fail: those first, in order,
    then copies of them, as many as failed. Empty when every record failed."""
    kept = [i for i, bad in enumerate(failed) if not bad]
    return [kept[n % len(kept)] for n in range(len(failed))] if kept else []


def require_records(batch: Batch) -> Batch:
    """A training batch with a label outside the classes, or in which no record could be used,
    stops the run."""
    if batch.label_outside is not None:
        raise TrainingLabelOutside(*batch.label_outside)
    if not len(batch.labels):
        raise UserError(
            f"every record of a batch failed to decode (keys {batch.bad_keys[:3]} "
            "...): check the DB with resnet50-db inspect"
        )
    return batch
