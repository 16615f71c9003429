"""Top-1 and top-5 accuracy over the test DB (or its first --test_epoch_size records), shared by
all processes, with the test labels' range: a label outside the model's classes stops the run
(refuse_labels_outside). Preflight checks the test labels only as far as a few seconds allow (a
cold 6 GB DB takes minutes), so the first test checks the rest as it reads them."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from resnet50_trainer.config.settings import Config
from resnet50_trainer.distributed import process_group
from resnet50_trainer.distributed.stopping import stop_run
from resnet50_trainer.errors import exit_status
from resnet50_trainer.model.replica import Replica
from resnet50_trainer.path_words import shown
from resnet50_trainer.train.labels import test_label_refusal

log = logging.getLogger(__name__)
# Top-5 as the later original logged it; with fewer labels every one is in the top k.
TOP_K = 5


@dataclass(frozen=True)
class TestAccuracy:
    top1: float
    top5: float
    images: int  # scored, over all processes
    bad_records: int  # left out, over all processes
    labels: tuple[int, int]  # the smallest and the largest label scored (0, 0 without any)


@torch.no_grad()
def evaluate(
    replica: Replica,
    test_batches: Iterable | None,
    device: torch.device,
    is_main: bool,
    model: torch.nn.Module | None = None,
) -> TestAccuracy | None:
    """BN in eval mode; None without --test_data. Each process scores its share (on the device
    already); the counts are all-reduced, at once, on this process's own `device`. `model`: the
    weights scored, if not the replica's (its EMA; the replica's own evaluation warns of
    unreadable records)."""
    if test_batches is None:
        return None
    model = replica.model if model is None else model
    precision = replica.precision
    take_first_process_statistics(model, device)
    model.eval()
    correct = torch.zeros(2, dtype=torch.float64, device=replica.output_device)  # top-1, top-5
    # The largest label and the negated smallest, kept on the device: no wait for it per batch.
    extremes = torch.full((2,), -(2**62), dtype=torch.int64, device=replica.output_device)
    images = bad = 0
    for batch in test_batches:
        if not len(batch.labels):  # every record of the batch failed
            bad += len(batch.bad_keys)
            continue
        good = batch.num_real  # filled-in copies are not scored
        with precision.autocast():
            logits = model(precision.inputs(batch.images[:good]))
        labels = batch.labels[:good].to(replica.output_device)
        extremes = torch.maximum(extremes, torch.stack([labels.max(), -labels.min()]))
        correct += _correct_in_top(logits, labels)
        images, bad = images + good, bad + len(batch.bad_keys)
    model.train()
    counts = torch.cat(
        [correct.to(device), torch.tensor([images, bad], dtype=torch.float64, device=device)]
    )
    with process_group.waiting_for_peers("the all-reduce of the test counts"):
        dist.all_reduce(counts)
        extremes = extremes.to(device)
        dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
        top1, top5, images, bad = counts.tolist()  # NCCL: the wait is here
        label_range = (-int(extremes[1]), int(extremes[0])) if images else (0, 0)
    if bad and is_main and model is replica.model:
        log.warning(
            "Test accuracy over %d records: %d of the test DB's records could not be "
            "read and were left out (resnet50-db inspect names them)",
            images,
            bad,
        )
    return TestAccuracy(
        top1 / max(images, 1), top5 / max(images, 1), int(images), int(bad), label_range
    )


def refuse_labels_outside(score: TestAccuracy | None, config: Config, is_main: bool) -> None:
    """A test label outside the model's classes stops the run on every process (each holds the
    same score); the first process reports it."""
    classes = config.num_labels
    for label in score.labels if score is not None else ():
        if not 0 <= label < classes:
            refusal = test_label_refusal(
                f"--test_data {shown(config.test_data or '')}", label, classes
            )
            stop_run(refusal if is_main else None, exit_status(refusal))


def evaluate_ema(
    replica: Replica, test_batches: Iterable | None, device: torch.device, is_main: bool
) -> TestAccuracy | None:
    """The EMA's accuracy (None without --ema_decay or --test_data), with the first process's
    batch-norm statistics everywhere: the average its checkpoint holds. Unreadable records were
    warned of by the model's evaluation."""
    if replica.ema is None or test_batches is None:
        return None
    return evaluate(replica, test_batches, device, is_main, replica.ema.module)


def take_first_process_statistics(model: torch.nn.Module, device: torch.device) -> None:
    """Every process's `model` gets the first process's batch-norm statistics. The weights are the
    same everywhere, but each process's statistics come from its own last batches (DDP hands out
    rank 0's only at the next forward, which overwrites them anyway): so every process scores,
    and the checkpoint holds, one model."""
    buffers = list(model.buffers())
    # float64 holds float32 statistics and the int64 batch counts exactly.
    flat = torch.cat([buffer.reshape(-1).to(device, torch.float64) for buffer in buffers])
    with process_group.waiting_for_peers("the broadcast of the batch-norm statistics"):
        dist.broadcast(flat, 0)
    for buffer, values in zip(buffers, flat.split([buffer.numel() for buffer in buffers])):
        buffer.copy_(values.view_as(buffer))


def _correct_in_top(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """How many labels are the top prediction, and how many are among the top 5 (of at most
    as many labels as there are), as float64 on the logits' device."""
    top = logits.topk(min(TOP_K, logits.shape[1]), dim=1).indices
    hits = top == labels[:, None]
    return torch.stack([hits[:, 0].sum(), hits.any(dim=1).sum()]).double()
