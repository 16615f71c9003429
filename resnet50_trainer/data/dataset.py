"""The records of one DB as a torch Dataset: each read, checked, and handed to a decode strategy
(data/cpu_decode.py or data/gpu_decode.py) with the crop its stream position draws."""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
from torch.utils.data import Dataset

from resnet50_trainer.data import transforms
from resnet50_trainer.data.batch import Batch, Fetched
from resnet50_trainer.data.formats.databases import open_database
from resnet50_trainer.data.formats.db_reader import Database
from resnet50_trainer.data.formats.record_view import parse_record_view
from resnet50_trainer.data.formats.records import Record
from resnet50_trainer.data.order import StepReads
from resnet50_trainer.data.settings import RANDOM_RESIZED_CROP, InputSettings
from resnet50_trainer.errors import RecordError

log = logging.getLogger(__name__)


class _LabelOutside(Exception):
    def __init__(self, label: int):
        super().__init__(f"label {label} outside the model's classes")
        self.label = label


class DecodeStrategy(Protocol):
    """Where records are decoded: what an input process makes of one record, how those samples
    make a batch, and the stage that turns the batch into a device Batch in the training process
    (STAGE_SPAN: its name in a profile's trace, data/spans.py)."""

    STAGE_SPAN: str

    def sample(self, record: Record, key: bytes, plan_for: transforms.PlanFor) -> Any: ...

    def failed(self, key: bytes, outside_label: int | None = None) -> Any: ...

    def batch(self, fetched: Sequence[Fetched]) -> Any: ...

    def collate(self, samples: Sequence[Any]) -> Any: ...

    def stage(self, device: torch.device) -> Callable[[Any], Batch]: ...


class ImageRecords(Dataset):
    """Records of one DB as `decoding`'s samples. The DB is opened on first use, in the process
    that reads it (an input process, after fork), never shared across processes."""

    def __init__(
        self,
        path: str,
        db_type: str,
        keys: Sequence[bytes],
        settings: InputSettings,
        train: bool,
        decoding: DecodeStrategy,
    ):
        self.path, self.db_type, self.keys = path, db_type, keys
        self.settings, self.train, self.decoding = settings, train, decoding
        self._database: Database | None = None
        # Runs of --read_order already asked of storage, and their length.
        self._asked_runs: set[int] = set()
        self._asked_run_length = 1

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, item):
        key, plan_for = self._locate(item)
        try:
            return self.decoding.sample(self.read_record(key), key, plan_for)
        except _LabelOutside as outside:
            return self.decoding.failed(key, outside.label)
        except RecordError as error:
            log.debug("record %r: %s", key, error)
            return self.decoding.failed(key)

    def __getitems__(self, reads: StepReads | Sequence) -> Any:
        """A whole batch at once (the DataLoader's batched fetch, whose collate_fn then passes
        the strategy's batch on): a training step's reads (StepReads), or test record indices.
        Its records are asked of the storage together (Database.prefetch), then the strategy
        writes them into one batch."""
        items = reads.items if isinstance(reads, StepReads) else reads
        located = [self._locate(item) for item in items]
        keys = [key for key, _ in located]
        if isinstance(reads, StepReads) and reads.run_length > 1:
            keys += self._runs_to_ask(reads)
        self._open().prefetch(keys)
        fetched, outside = [], None
        for key, plan_for in located:
            try:
                record: Record | None = self.read_record(key)
            except _LabelOutside as error:
                # Its place is filled as a bad record's; the batch names it (require_records).
                record, outside = None, outside or (key, error.label)
            except RecordError as error:
                log.debug("record %r: %s", key, error)
                record = None
            fetched.append(Fetched(record, key, plan_for))
        batch = self.decoding.batch(fetched)
        return batch if outside is None else batch._replace(label_outside=outside)

    def _runs_to_ask(self, reads: StepReads) -> list[bytes]:
        """In quasi-random order, the keys of the whole run of each record of this step and of
        the next whose run was not asked for yet: storage serves a run in one request (the next
        step's while this one decodes), and the steps after find the rest of it in the page
        cache (a window of runs, --read_window_mb, stays there)."""
        length = reads.run_length
        too_many = len(self._asked_runs) > 4 * reads.window_runs  # windows read long ago: again
        if length != self._asked_run_length or too_many:
            self._asked_runs.clear()
            self._asked_run_length = length
        keys: list[bytes] = []
        for index in [index for _, index in reads.items] + reads.ahead:
            run = index // length
            if run not in self._asked_runs:
                self._asked_runs.add(run)
                keys.extend(self.keys[run * length : (run + 1) * length])
        return keys

    def _locate(self, item) -> tuple[bytes, transforms.PlanFor]:
        """The key of an item and its crop. Training items are (stream position, record index):
        the position seeds the augmentation, so crops do not depend on which input process
        decodes them."""
        position, index = item if self.train else (item, item)
        return self.keys[index], functools.partial(self.crop_plan, position)

    def _open(self) -> Database:
        if self._database is None:
            # Emptiness was checked by read_keys; listing the keys again here would be wasted work.
            self._database = open_database(self.path, self.db_type, allow_empty=True)
        return self._database

    def read_record(self, key: bytes) -> Record:
        """The parsed record under `key`; RecordError if it cannot be used."""
        # The file bytes go from an LMDB's memory map into the decoder without a copy.
        record = parse_record_view(self._open().view(key))
        num_labels = self.settings.num_labels
        # A test record's label goes on to evaluation, which stops the run on one out of range;
        # a training record's stops training (the batch names it: require_records).
        if self.train and not 0 <= record.label < num_labels:
            raise _LabelOutside(record.label)
        return record

    def crop_plan(
        self, position: int, width: int, height: int, reducible: bool
    ) -> transforms.DecodePlan:
        """The crop of a full-size `width` x `height` image at this stream position: a fresh RNG
        seeded by the position, so every call for one position draws the same crop."""
        settings = self.settings
        if not self.train:
            return transforms.scale_plan(
                width, height, settings.scale, settings.image_size, None, reducible
            )
        rng = random.Random(f"{settings.seed}:{position}")
        if settings.crop == RANDOM_RESIZED_CROP:
            return transforms.random_resized_plan(
                width,
                height,
                settings.image_size,
                settings.crop_area,
                settings.crop_ratio,
                rng,
                reducible,
            )
        return transforms.scale_plan(
            width, height, settings.scale, settings.image_size, rng, reducible
        )
