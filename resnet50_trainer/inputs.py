"""The run's input pipelines, built from its settings: training batches and the test share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Union

import torch
from torch.utils.data import DataLoader

from resnet50_trainer.config import SYNTHETIC_EPOCH_SIZE, Config
from resnet50_trainer.data.loader import (Batch, ImageRecords, RecordOrder, ShardBatchSampler,
                                          SyntheticBatches, evaluation_batches, make_loader,
                                          read_keys)
from resnet50_trainer.distributed import Placement
from resnet50_trainer.errors import UserError


@dataclass
class TrainInput:
    batches: Iterable[Batch]
    epoch_plan: Union[ShardBatchSampler, SyntheticBatches]  # set_epoch(epoch, start_step)
    steps_per_epoch: int
    num_records: int


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
    records = _records(config, config.train_data, keys, train=True)
    loader = make_loader(records, sampler, config.num_workers, pin_memory=device.type == "cuda")
    return TrainInput(loader, sampler, steps, len(keys))


def build_test_input(config: Config, placement: Placement, device: torch.device) -> Optional[DataLoader]:
    """This process's share of the whole test DB, or None without --test_data."""
    if config.test_data is None:
        return None
    keys = read_keys(config.test_data, config.db_type)
    batches = evaluation_batches(len(keys), config.device_batch_size, placement.rank,
                                 placement.world_size)
    records = _records(config, config.test_data, keys, train=False)
    return make_loader(records, batches, config.num_workers, pin_memory=device.type == "cuda")


def _records(config: Config, path: str, keys: list, train: bool) -> ImageRecords:
    return ImageRecords(path, config.db_type, keys, config.num_labels, config.num_channels,
                        config.scale, config.image_size, config.seed, train)


def _require_steps(config: Config, num_records: int, what: str) -> int:
    steps = config.iterations_per_epoch(num_records)
    if steps == 0:
        raise UserError(f"the {what} has {num_records} images, fewer than one global batch of "
                        f"{config.global_batch_size}: lower --batch_size or raise --epoch_size")
    return steps
