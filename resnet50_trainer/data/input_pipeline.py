"""The input pipeline of one DB, put together: records, a decode strategy, input processes, and
the prefetcher that hands the training process device Batches."""

from __future__ import annotations

import faulthandler
import signal
import sys
import traceback
from collections.abc import Sequence

import torch
from torch._utils import ExceptionWrapper
from torch.utils.data import DataLoader, get_worker_info

from resnet50_trainer import cpython_private
from resnet50_trainer.data.cpu_decode import CpuDecode
from resnet50_trainer.data.dataset import DecodeStrategy, ImageRecords
from resnet50_trainer.data.gpu_decode import GpuDecode
from resnet50_trainer.data.prefetch import BatchWaits, DevicePrefetcher
from resnet50_trainer.data.settings import InputSettings
from resnet50_trainer.lifecycle import END_SIGNAL, PREEMPT_SIGNALS, end_input_processes_at_exit


def decode_strategy(settings: InputSettings) -> DecodeStrategy:
    return GpuDecode(settings) if settings.decode_on_gpu else CpuDecode(settings)


def make_loader(
    records: ImageRecords, batch_sampler, num_workers: int, pin_memory: bool
) -> DataLoader:
    """Batches of `records` in `batch_sampler`'s order, collated as their strategy says. Input
    processes are forked (they share the keys' pages and need no torch import of their own; they
    never touch the GPU): multiprocessing's default in a training process is how that process
    was started (the launcher's fork server, or spawn), which would start each afresh."""
    if num_workers > 0:
        end_input_processes_at_exit()
    return DataLoader(
        records,
        batch_sampler=batch_sampler,
        num_workers=num_workers,
        collate_fn=records.decoding.collate,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
        worker_init_fn=start_input_process,
        multiprocessing_context="fork" if num_workers > 0 else None,
    )


def start_input_process(worker_id: int) -> None:
    ignore_stop_signals(worker_id)
    sys.excepthook = quiet_when_the_receiver_is_gone(sys.excepthook)
    faulthandler.disable()  # its training process's, into that one's watcher (launch/watcher.py)
    cpython_private.hand_unsent_queue_items_to(_batch_not_handed_over)


def _batch_not_handed_over(queue, error: Exception, sent: object) -> None:
    """multiprocessing's hook for what its queue's feeder thread could not send: a batch whose
    labels could not be put in shared memory (/dev/shm full) or whose file descriptor could not
    be passed (the limit on open files). Sent instead as that batch's error, which the DataLoader
    raises in the training process as any error of an input process (with the limit named,
    limits.py); multiprocessing would print a traceback and drop the batch, and the training
    process wait for it until its timeout (20 minutes for a first batch)."""
    if isinstance(sent, tuple) and len(sent) == 2 and not isinstance(sent[1], ExceptionWrapper):
        worker = get_worker_info()
        where = f"in DataLoader worker process {worker.id if worker else '?'}, handing a batch over"
        queue.put((sent[0], ExceptionWrapper((type(error), error, error.__traceback__), where)))
        return
    cpython_private.report_unsent_as_cpython_does(error, sent)


def quiet_when_the_receiver_is_gone(report):
    """sys.excepthook, but silent on a connection broken inside multiprocessing's resource sharer,
    the thread that hands a batch's shared memory to the training process: it breaks only when
    that process died mid-handover (killed, or its run failed), which the run reports in its own
    line; the sharer would add a traceback (it reports through sys.excepthook)."""

    def excepthook(kind, value, tb) -> None:
        frames = traceback.extract_tb(tb)
        sharer = frames and cpython_private.in_resource_sharer(frames[0].filename)
        if not (sharer and issubclass(kind, (ConnectionError, EOFError))):
            report(kind, value, tb)

    return excepthook


def ignore_stop_signals(worker_id: int) -> None:
    """An input process ignores a scheduler's stop signal, sent to the whole process group: its
    training process saves the run's position and then ends it with END_SIGNAL (lifecycle.py), on
    which it exits as if its work were done, its exit finalizers run (DevicePrefetcher starts it
    with the stop signals blocked, so none kills it before this runs). Ctrl-Z too, where its
    training process, which it inherits the handler of, pauses at a step its peers agree on
    (distributed/pausing.py) and stops it then: stopped now, it would starve its training process
    until then."""
    for signum in PREEMPT_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    if signal.getsignal(signal.SIGTSTP) not in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTSTP, signal.SIG_IGN)
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
    waits: BatchWaits | None = None,
) -> DevicePrefetcher:
    """Batches of the DB at `path` in `batch_sampler`'s order, decoded, cropped and on `device`.
    A batch in which every record failed stops training; evaluation counts its keys. `waits`:
    DevicePrefetcher's limits on a batch from input processes."""
    decoding = decode_strategy(settings)
    records = ImageRecords(path, db_type, keys, settings, train, decoding)
    loader = make_loader(
        records, batch_sampler, settings.num_workers, pin_memory=device.type == "cuda"
    )
    stage = decoding.stage(device)
    return DevicePrefetcher(
        loader, device, stage, allow_empty=not train, waits=waits, stage_span=decoding.STAGE_SPAN
    )
