"""The run's input pipelines, built from its settings: training batches and the test share, on the
training device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence, Union

import torch

from resnet50_trainer.config import SYNTHETIC_EPOCH_SIZE, Config
from resnet50_trainer.data.gpu_decode import BatchDecoder, EncodedRecords, collate_encoded
from resnet50_trainer.data.loader import (Batch, ImageRecords, RecordOrder, ShardBatchSampler,
                                          SyntheticBatches, collate, evaluation_batches,
                                          make_loader, read_keys)
from resnet50_trainer.data.prefetch import DevicePrefetcher, copy_to_device
from resnet50_trainer.distributed import Placement
from resnet50_trainer.errors import UserError


@dataclass
class TrainInput:
    batches: Iterable[Batch]  # on the training device
    epoch_plan: Union[ShardBatchSampler, SyntheticBatches]  # set_epoch(epoch, start_step)
    steps_per_epoch: int
    num_records: int


@dataclass(frozen=True)
class DecodeSettings:
    """How records become crops: what the trainer's flags say, and what `resnet50-db bench` asks."""

    num_labels: int
    num_channels: int
    scale: int
    image_size: int
    seed: int
    num_workers: int
    decode_on_gpu: bool

    @classmethod
    def of(cls, config: Config) -> "DecodeSettings":
        return cls(config.num_labels, config.num_channels, config.scale, config.image_size,
                   config.seed, config.num_workers, config.decode_device == "gpu")


def build_train_input(config: Config, placement: Placement, device: torch.device) -> TrainInput:
    if config.synthetic:
        images = config.epoch_size or SYNTHETIC_EPOCH_SIZE
        steps = _require_steps(config, images, "synthetic epoch")
        synthetic = SyntheticBatches(steps, config.device_batch_size, config.num_channels,
                                     config.image_size, config.num_labels, device, config.seed)
        return TrainInput(synthetic, synthetic, steps, images)
    keys = read_keys(config.train_data, config.db_type)
    steps = _require_steps(config, len(keys), f"training DB {config.train_data}")
    sampler = ShardBatchSampler(RecordOrder(len(keys), config.seed), steps,
                                config.global_batch_size, config.device_batch_size, placement.rank)
    batches = device_batches(config.train_data, config.db_type, keys, sampler, device,
                             DecodeSettings.of(config), train=True)
    return TrainInput(batches, sampler, steps, len(keys))


def build_test_input(config: Config, placement: Placement,
                     device: torch.device) -> Optional[DevicePrefetcher]:
    """This process's share of the whole test DB, or None without --test_data."""
    if config.test_data is None:
        return None
    keys = read_keys(config.test_data, config.db_type)
    batches = evaluation_batches(len(keys), config.device_batch_size, placement.rank,
                                 placement.world_size)
    return device_batches(config.test_data, config.db_type, keys, batches, device,
                          DecodeSettings.of(config), train=False)


def device_batches(path: str, db_type: str, keys: Sequence[bytes], batch_sampler,
                   device: torch.device, settings: DecodeSettings, train: bool) -> DevicePrefetcher:
    """Batches of the DB at `path` in `batch_sampler`'s order, decoded, cropped and on `device`."""
    records_type = EncodedRecords if settings.decode_on_gpu else ImageRecords
    records = records_type(path, db_type, keys, settings.num_labels, settings.num_channels,
                           settings.scale, settings.image_size, settings.seed, train)
    loader = make_loader(records, batch_sampler, settings.num_workers,
                         pin_memory=device.type == "cuda",
                         collate_fn=collate_encoded if settings.decode_on_gpu else collate)
    stage = (BatchDecoder(device, settings.num_channels, settings.image_size)
             if settings.decode_on_gpu else copy_to_device(device))
    return DevicePrefetcher(loader, device, stage, allow_empty=not train)


def _require_steps(config: Config, num_records: int, what: str) -> int:
    steps = config.iterations_per_epoch(num_records)
    if steps == 0:
        raise UserError(f"the {what} has {num_records} images, fewer than one global batch of "
                        f"{config.global_batch_size}: lower --batch_size or raise --epoch_size")
    return steps
