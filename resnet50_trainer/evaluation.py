"""Top-1 and top-5 accuracy over the test DB (or its first --test_epoch_size records), shared by
all processes. A test label outside the model's classes stops the run, on every process alike:
preflight checks the test labels only as far as a few seconds allow (a cold 6 GB DB takes
minutes), so the first test checks the rest as it reads them."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from resnet50_trainer import distributed
from resnet50_trainer.errors import UserError
from resnet50_trainer.replica import Replica

log = logging.getLogger(__name__)
# Top-5 as the later original logged it; with fewer labels every one is in the top k.
TOP_K = 5


@dataclass(frozen=True)
class TestAccuracy:
    top1: float
    top5: float
    images: int  # scored, over all processes
    bad_records: int  # left out, over all processes


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
    weights scored, if not the replica's (its EMA)."""
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
    with distributed.waiting_for_peers("the all-reduce of the test counts"):
        dist.all_reduce(counts)
        top1, top5, images, bad = counts.tolist()  # NCCL: the wait is here
        extremes = extremes.to(device)
        dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
    for label in (int(extremes[0]), -int(extremes[1])):  # the largest, the smallest
        if images and not 0 <= label < replica.num_labels:
            raise test_label_refusal("--test_data", label, replica.num_labels)
    if bad and is_main:
        log.warning(
            "Test accuracy over %d records: %d of the test DB's records could not be "
            "read and were left out (resnet50-db inspect names them)",
            images,
            bad,
        )
    return TestAccuracy(top1 / max(images, 1), top5 / max(images, 1), int(images), int(bad))


def evaluate_ema(
    replica: Replica, test_batches: Iterable | None, device: torch.device
) -> TestAccuracy | None:
    """The EMA's accuracy (None without --ema_decay or --test_data), with the first process's
    batch-norm statistics everywhere: the average its checkpoint holds. Unreadable records were
    warned of by the model's evaluation."""
    if replica.ema is None or test_batches is None:
        return None
    return evaluate(replica, test_batches, device, False, replica.ema.module)


def test_label_refusal(test_data: str, label: int, num_labels: int, key: bytes = b"") -> UserError:
    """`test_data`: how the message names the DB ("--test_data PATH")."""
    named = f" (key {key.decode(errors='replace')})" if key else ""
    fix = f"set --num_labels to at least {label + 1} or use" if label > 0 else "use"
    return UserError(
        f"{test_data} holds label {label}{named}, outside 0..{num_labels - 1}: "
        f"{fix} a test DB of this model's classes"
    )


def take_first_process_statistics(model: torch.nn.Module, device: torch.device) -> None:
    """Every process's `model` gets the first process's batch-norm statistics. The weights are the
    same everywhere, but each process's statistics come from its own last batches (DDP hands out
    rank 0's only at the next forward, which overwrites them anyway): so every process scores,
    and the checkpoint holds, one model."""
    buffers = list(model.buffers())
    # float64 holds float32 statistics and the int64 batch counts exactly.
    flat = torch.cat([buffer.reshape(-1).to(device, torch.float64) for buffer in buffers])
    with distributed.waiting_for_peers("the broadcast of the batch-norm statistics"):
        dist.broadcast(flat, 0)
    for buffer, values in zip(buffers, flat.split([buffer.numel() for buffer in buffers])):
        buffer.copy_(values.view_as(buffer))


def _correct_in_top(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """How many labels are the top prediction, and how many are among the top 5 (of at most
    as many labels as there are), as float64 on the logits' device."""
    top = logits.topk(min(TOP_K, logits.shape[1]), dim=1).indices
    hits = top == labels[:, None]
    return torch.stack([hits[:, 0].sum(), hits.any(dim=1).sum()]).double()
