"""Which records each process reads, in what order, and the input processes that decode them.

The run reads one global stream of records: pass k over the DB is a permutation seeded by
(seed, k). Every epoch starts at a fresh pass; step s of an epoch takes the next global batch of
positions and process r takes its own slice of it. So no record is read twice in an epoch across
all processes (while an epoch is at most one pass), the order changes every epoch, and the order
is a function of (seed, epoch, step) alone: a resume, on any number of processes, reads exactly
what an uninterrupted run would have.
"""

from __future__ import annotations

import logging
import math
import random
from typing import Iterator, NamedTuple, Optional, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from resnet50_trainer.data import transforms
from resnet50_trainer.data.databases import open_database
from resnet50_trainer.data.records import Record, decode_image, decode_jpeg_reduced, jpeg_header, \
    parse_record
from resnet50_trainer.errors import RecordError, UserError

log = logging.getLogger(__name__)


class Sample(NamedTuple):
    image: Optional[torch.Tensor]  # CHW uint8; None when the record failed
    label: int
    bad_key: Optional[bytes]


class Batch(NamedTuple):
    images: torch.Tensor  # NCHW uint8
    labels: torch.Tensor  # N int64
    # Keys of records that failed. The first len(labels) - len(bad_keys) samples are the records
    # that decoded, in order; the rest are copies of them, so shapes stay fixed.
    bad_keys: list


def read_keys(path: str, db_type: str) -> list[bytes]:
    """All keys of a DB in key order, read once by each training process; UserError if empty."""
    with open_database(path, db_type) as database:
        return database.keys()


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
                self.num_records)
            self._pass = pass_index
        return int(self._permutation[offset])


class ShardBatchSampler(Sampler):
    """This process's (position, record index) pairs, one list per step of the current epoch."""

    def __init__(self, order: RecordOrder, steps_per_epoch: int, global_batch: int,
                 device_batch: int, rank: int):
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


class ImageRecords(Dataset):
    """Records of one DB decoded to uint8 crops. The DB is opened on first use, in the process that
    reads it (an input process, after fork), never shared across processes."""

    def __init__(self, path: str, db_type: str, keys: Sequence[bytes], num_labels: int,
                 num_channels: int, scale: int, image_size: int, seed: int, train: bool):
        self.path, self.db_type, self.keys = path, db_type, keys
        self.num_labels, self.num_channels = num_labels, num_channels
        self.scale, self.image_size = scale, image_size
        self.seed, self.train = seed, train
        self._database = None

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, item) -> Sample:
        # Training items are (stream position, record index): the position seeds the augmentation,
        # so crops do not depend on which input process decodes them.
        position, index = item if self.train else (item, item)
        key = self.keys[index]
        try:
            return self.sample(self.read_record(key), position, key)
        except RecordError as error:
            log.debug("record %r: %s", key, error)
            return Sample(None, -1, key)

    def sample(self, record: Record, position: int, key: bytes) -> Sample:
        """The record decoded and cropped; RecordError if it cannot be decoded."""
        image = self._decode_jpeg(record, key)
        if image is None:  # raw pixels, PNG, CMYK, or a JPEG libjpeg-turbo refused (draft mode)
            image = transforms.pil_to_chw(
                decode_image(record, self.num_channels, draft_size=(self.scale, self.scale)))
        # The plan is made for the image as decoded: a reduced decode is cropped in its own pixels.
        plan = self.crop_plan(position, image.shape[2], image.shape[1])
        return Sample(transforms.resize_crop(image, plan, self.image_size), record.label, None)

    def _decode_jpeg(self, record: Record, key: bytes) -> Optional[torch.Tensor]:
        """CHW uint8 of a gray or colour JPEG, DCT-scaled down towards `scale`; None for anything
        else, and for a JPEG libjpeg-turbo refuses, which Pillow then gets to judge as before."""
        size = jpeg_header(record)
        if size is None:
            return None
        try:
            pixels = decode_jpeg_reduced(record.encoded, size, self.num_channels, self.scale)
        except RecordError as error:
            log.debug("record %r: %s; trying Pillow", key, error)
            return None
        return torch.from_numpy(pixels).permute(2, 0, 1)  # CHW view of HWC memory, as pil_to_chw

    def read_record(self, key: bytes) -> Record:
        """The parsed record under `key`; RecordError if it cannot be used."""
        if self._database is None:
            # Emptiness was checked by read_keys; listing the keys again here would be wasted work.
            self._database = open_database(self.path, self.db_type, allow_empty=True)
        record = parse_record(self._database.get(key))
        if not 0 <= record.label < self.num_labels:
            raise RecordError(f"label {record.label} outside 0..{self.num_labels - 1}")
        return record

    def crop_plan(self, position: int, width: int, height: int) -> transforms.CropPlan:
        if self.train:
            return transforms.random_plan(width, height, self.scale, self.image_size,
                                          random.Random(f"{self.seed}:{position}"))
        return transforms.centre_plan(width, height, self.scale, self.image_size)


def collate(samples: Sequence[Sample]) -> Batch:
    """Stack a batch, filling the places of failed records with good samples so shapes stay fixed."""
    filled, bad_keys = fill_bad_places(samples)
    if not filled:
        return Batch(torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.int64), bad_keys)
    return Batch(torch.stack([sample.image for sample in filled]),
                 torch.tensor([sample.label for sample in filled], dtype=torch.int64),
                 bad_keys)


def fill_bad_places(samples: Sequence) -> tuple[list, list]:
    """(the good samples followed by copies of them in the failed ones' number, the failed keys).
    No samples at all when every record failed: the training process then decides (training
    stops, require_records; evaluation counts them), since an error raised here, in an input
    process, would reach the user wrapped in that process's traceback."""
    order = filled_order([sample.bad_key is not None for sample in samples])
    bad_keys = [sample.bad_key for sample in samples if sample.bad_key is not None]
    return [samples[i] for i in order], bad_keys


def filled_order(failed: Sequence[bool]) -> list[int]:
    """The places of a batch filled from the records that did not fail: those first, in order,
    then copies of them, as many as failed. Empty when every record failed."""
    kept = [i for i, bad in enumerate(failed) if not bad]
    return [kept[n % len(kept)] for n in range(len(failed))] if kept else []


def require_records(batch: Batch) -> Batch:
    """A training batch in which no record could be used stops the run."""
    if not len(batch.labels):
        raise UserError(f"every record of a batch failed to decode (keys {batch.bad_keys[:3]} "
                        "...): check the DB with resnet50-db inspect")
    return batch


def make_loader(records: ImageRecords, batch_sampler, num_workers: int, pin_memory: bool,
                collate_fn=collate) -> DataLoader:
    return DataLoader(records, batch_sampler=batch_sampler, num_workers=num_workers,
                      collate_fn=collate_fn, pin_memory=pin_memory,
                      persistent_workers=num_workers > 0)


def evaluation_batches(num_records: int, batch_size: int, rank: int, world_size: int) -> list[list[int]]:
    """Each process's share of the whole test DB: every record exactly once across processes."""
    mine = list(range(rank, num_records, world_size))
    return [mine[i:i + batch_size] for i in range(0, len(mine), batch_size)]


class SyntheticBatches:
    """`--train_data null`: one random batch made on the device and reused, so the input pipeline
    costs nothing and the figure is compute alone."""

    def __init__(self, steps_per_epoch: int, batch_size: int, num_channels: int, image_size: int,
                 num_labels: int, device: torch.device, seed: int):
        generator = torch.Generator().manual_seed(seed)
        images = torch.randint(0, 256, (batch_size, num_channels, image_size, image_size),
                               dtype=torch.uint8, generator=generator)
        labels = torch.randint(0, num_labels, (batch_size,), generator=generator)
        self.batch = Batch(images.to(device), labels.to(device), [])
        self.steps_per_epoch = steps_per_epoch
        self.start_step = 0

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        self.start_step = start_step

    def __len__(self) -> int:
        return self.steps_per_epoch - self.start_step

    def __iter__(self) -> Iterator[Batch]:
        return (self.batch for _ in range(len(self)))
