"""Top-1 accuracy over the whole test DB, shared by all processes."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from resnet50_trainer import distributed
from resnet50_trainer.replica import Replica

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Score:
    accuracy: float
    images: int  # scored, over all processes
    bad_records: int  # left out, over all processes


def evaluate(
    replica: Replica, test_batches: Iterable | None, device: torch.device, is_main: bool
) -> float | None:
    """The top-1 accuracy (score_test_db's), None without --test_data."""
    score = score_test_db(replica, test_batches, device, is_main)
    return None if score is None else score.accuracy


@torch.no_grad()
def score_test_db(
    replica: Replica, test_batches: Iterable | None, device: torch.device, is_main: bool
) -> Score | None:
    """BN in eval mode; None without --test_data. Each process scores its share (on the device
    already); the counts are all-reduced on this process's own `device`."""
    if test_batches is None:
        return None
    model, precision = replica.model, replica.precision
    model.eval()
    correct = torch.zeros(1, dtype=torch.float64, device=replica.output_device)
    images = bad = 0
    for batch in test_batches:
        if not len(batch.labels):  # every record of the batch failed
            bad += len(batch.bad_keys)
            continue
        good = batch.num_real  # filled-in copies are not scored
        with precision.autocast():
            predictions = model(precision.inputs(batch.images[:good])).argmax(1)
        correct += (predictions == batch.labels[:good].to(replica.output_device)).sum()
        images, bad = images + good, bad + len(batch.bad_keys)
    model.train()
    counts = torch.cat(
        [correct.to(device), torch.tensor([images, bad], dtype=torch.float64, device=device)]
    )
    with distributed.waiting_for_peers("the all-reduce of the test counts"):
        dist.all_reduce(counts)
        correct, images, bad = counts.tolist()  # NCCL: the wait is here
    if bad and is_main:
        log.warning(
            "Test accuracy over %d records: %d of the test DB's records could not be "
            "read and were left out (resnet50-db inspect names them)",
            images,
            bad,
        )
    return Score(correct / max(images, 1), int(images), int(bad))
