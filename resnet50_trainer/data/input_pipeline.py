"""The input pipeline of one DB, put together: records, a decode strategy, input processes, and
the prefetcher that hands the training process device Batches."""

from __future__ import annotations

import signal
from collections.abc import Sequence

import torch
from torch.utils.data import DataLoader

from resnet50_trainer.data.cpu_decode import CpuDecode
from resnet50_trainer.data.dataset import DecodeStrategy, ImageRecords
from resnet50_trainer.data.gpu_decode import GpuDecode
from resnet50_trainer.data.prefetch import DevicePrefetcher
from resnet50_trainer.data.settings import InputSettings
from resnet50_trainer.errors import END_SIGNAL, PREEMPT_SIGNALS, end_input_processes_at_exit


def decode_strategy(settings: InputSettings) -> DecodeStrategy:
    return GpuDecode(settings) if settings.decode_on_gpu else CpuDecode(settings)


def make_loader(
    records: ImageRecords, batch_sampler, num_workers: int, pin_memory: bool
) -> DataLoader:
    """Batches of `records` in `batch_sampler`'s order, collated as their strategy says."""
    if num_workers > 0:
        end_input_processes_at_exit()
    return DataLoader(
        records,
        batch_sampler=batch_sampler,
        num_workers=num_workers,
        collate_fn=records.decoding.collate,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
        worker_init_fn=ignore_stop_signals,
    )


def ignore_stop_signals(worker_id: int) -> None:
    """An input process ignores a scheduler's stop signal, sent to the whole process group: its
    training process saves the run's position and then ends it with END_SIGNAL (errors.py), on
    which it exits as if its work were done, its exit finalizers run (DevicePrefetcher starts it
    with the stop signals blocked, so none kills it before this runs)."""
    for signum in PREEMPT_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    signal.signal(END_SIGNAL, _end_now)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, PREEMPT_SIGNALS)


def _end_now(signum: int, frame: object) -> None:
    # SystemExit, not KeyboardInterrupt: torch's worker loop swallows the latter, and the process
    # exits on the former silently, through multiprocessing's exit and its finalizers.
    raise SystemExit(0)


def device_batches(
    path: str,
    db_type: str,
    keys: Sequence[bytes],
    batch_sampler,
    device: torch.device,
    settings: InputSettings,
    train: bool,
) -> DevicePrefetcher:
    """Batches of the DB at `path` in `batch_sampler`'s order, decoded, cropped and on `device`.
    A batch in which every record failed stops training; evaluation counts its keys."""
    decoding = decode_strategy(settings)
    records = ImageRecords(path, db_type, keys, settings, train, decoding)
    loader = make_loader(
        records, batch_sampler, settings.num_workers, pin_memory=device.type == "cuda"
    )
    return DevicePrefetcher(loader, device, decoding.stage(device), allow_empty=not train)
