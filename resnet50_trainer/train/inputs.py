"""The run's input pipelines, built from its settings: training batches and the test share, on the
training device."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from resnet50_trainer.config.settings import SYNTHETIC_EPOCH_SIZE, Config
from resnet50_trainer.data.batch import Batch
from resnet50_trainer.data.formats.databases import read_keys
from resnet50_trainer.data.input_pipeline import device_batches
from resnet50_trainer.data.label_mix import poor_mix_warning
from resnet50_trainer.data.order import RecordOrder, ShardBatchSampler, evaluation_batches
from resnet50_trainer.data.prefetch import BatchWaits, DevicePrefetcher
from resnet50_trainer.data.settings import (
    DEFAULT_CROP_AREA,
    DEFAULT_CROP_RATIO,
    READ_ORDERS,
    SCALE_CROP,
    InputSettings,
    ReadOrder,
    database_bytes,
    memory_bytes,
    resolve_read_order,
)
from resnet50_trainer.data.synthetic import SyntheticBatches
from resnet50_trainer.distributed import process_group
from resnet50_trainer.distributed.preemption import stop_signal
from resnet50_trainer.distributed.process_group import Placement
from resnet50_trainer.errors import UserError
from resnet50_trainer.path_words import shown

log = logging.getLogger(__name__)
# How long a process of a run of several still waits for a batch once a stop signal has come: its
# peers are then in the next step's collectives, past where a position can be agreed, so it stops
# the run alone (epoch_loop.py). Well inside a scheduler's grace (Slurm's KillWait, Kubernetes'
# terminationGracePeriodSeconds: 30 s by default). A run of one process stops at once, saved.
STOP_WAIT_S = 5.0


@dataclass
class TrainInput:
    batches: Iterable[Batch]  # on the training device
    epoch_plan: ShardBatchSampler | SyntheticBatches  # set_epoch(epoch, start_step)
    steps_per_epoch: int
    order: ReadOrder | None = None  # how the DB is read (None: synthetic data)


def input_settings(config: Config, train: bool) -> InputSettings:
    """The training images' settings, or the test images': resized to --test_resize and cut by
    the centre crop of --test_image_size (ImageRecords centres the scale crop when not training)."""
    resize, size = (config.scale, config.image_size) if train else config.test_sizes
    return InputSettings(
        config.num_labels,
        config.num_channels,
        resize,
        size,
        config.seed,
        config.num_workers,
        config.decode_device == "gpu",
        crop=config.crop if train else SCALE_CROP,
        crop_area=config.crop_area or DEFAULT_CROP_AREA,
        crop_ratio=config.crop_ratio or DEFAULT_CROP_RATIO,
    )


def batch_waits(config: Config, placement: Placement) -> BatchWaits | None:
    """How long a training process waits for a batch from its input processes: as long as for
    its first step's collectives, then as long as for any later one (a run of several processes
    stopped there anyway, on the peer that waited); after a stop signal, STOP_WAIT_S in a run of
    several processes, none in a run of one. None without input processes: a read that hangs in
    the training process itself cannot be interrupted."""
    if config.num_workers == 0:
        return None
    return BatchWaits(
        config.first_iter_timeout,
        config.timeout,
        stopping=lambda: stop_signal() is not None,
        stop_after_s=0.0 if placement.world_size == 1 else STOP_WAIT_S,
    )


def build_train_input(config: Config, placement: Placement, device: torch.device) -> TrainInput:
    settings = input_settings(config, train=True)
    if config.synthetic:
        steps = _require_steps(config, config.epoch_size or SYNTHETIC_EPOCH_SIZE, "synthetic epoch")
        synthetic = SyntheticBatches(steps, config.device_batch_size, settings, device)
        return TrainInput(synthetic, synthetic, steps)
    keys = read_keys(config.train_data, config.db_type)
    steps = _require_steps(config, len(keys), f"training DB {shown(config.train_data)}")
    order = _agreed_read_order(config, len(keys), placement, device)
    sampler = ShardBatchSampler(
        RecordOrder(len(keys), config.seed, *order.shape),
        steps,
        config.global_batch_size,
        config.device_batch_size,
        placement.rank,
    )
    if placement.is_main:
        _warn_of_a_poor_mix(config, keys, sampler.order)
    batches = device_batches(
        config.train_data,
        config.db_type,
        keys,
        sampler,
        device,
        settings,
        train=True,
        waits=batch_waits(config, placement),
    )
    return TrainInput(batches, sampler, steps, order)


def _warn_of_a_poor_mix(config: Config, keys: Sequence[bytes], order: RecordOrder) -> None:
    mix = poor_mix_warning(
        config.train_data,
        config.db_type,
        keys,
        order,
        config.window_mb,
        config.global_batch_size,
    )
    if mix:
        log.warning(mix)


def _agreed_read_order(
    config: Config, num_records: int, placement: Placement, device: torch.device
) -> ReadOrder:
    """--read_order, the same on every process, which read one global stream: the first
    process's --read_order and --read_window_mb (machines' flags may differ), runs sized by its DB
    (machines may hold copies that differ in size), and auto takes quasi_random when any
    machine's memory cannot hold the DB."""
    memory = memory_bytes()
    db_bytes = database_bytes(config.train_data)
    main = placement.is_main
    first_flags = [READ_ORDERS.index(config.read_order), config.window_mb] if main else [0, 0]
    mine = [db_bytes > memory / 2, db_bytes if main else 0, *first_flags]
    agreed = torch.tensor(mine, dtype=torch.int64, device=device)
    with process_group.waiting_for_peers("the agreement on the read order"):
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        larger_anywhere, first_db_bytes, asked, window_mb = agreed.tolist()
    return resolve_read_order(
        READ_ORDERS[asked], num_records, first_db_bytes, memory, bool(larger_anywhere), window_mb
    )


def build_test_input(
    config: Config, placement: Placement, device: torch.device
) -> DevicePrefetcher | None:
    """This process's share of the test DB (its first --test_epoch_size records in key order),
    or None without --test_data."""
    if config.test_data is None:
        return None
    keys = read_keys(config.test_data, config.db_type)
    wanted = config.test_epoch_size
    if wanted is not None and wanted > len(keys) and placement.is_main:
        log.warning(
            "--test_epoch_size %d is more than the test DB's %d records: evaluating all of them",
            wanted,
            len(keys),
        )
    keys = keys[:wanted]
    batches = evaluation_batches(
        len(keys), config.device_batch_size, placement.rank, placement.world_size
    )
    return device_batches(
        config.test_data,
        config.db_type,
        keys,
        batches,
        device,
        input_settings(config, train=False),
        train=False,
        waits=batch_waits(config, placement),
    )


def _require_steps(config: Config, num_records: int, what: str) -> int:
    steps = config.iterations_per_epoch(num_records)
    if steps == 0:
        raise UserError(
            f"the {what} has {num_records} images, fewer than one global batch of "
            f"{config.global_batch_size}: lower --batch_size or raise --epoch_size"
        )
    return steps
