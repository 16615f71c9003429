"""What an epoch reports: its totals as it goes, its result, its row of the run log (and the log's
write failure as a verdict, so every process stops together), and the words of the console's epoch
line."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from resnet50_trainer.checkpoint.run_state import RunState
from resnet50_trainer.errors import UserError
from resnet50_trainer.reporting.progress import BAD_KEYS_NAMED
from resnet50_trainer.reporting.runlog import NO_TEST_ACCURACY, EpochRow, RunLog
from resnet50_trainer.train.evaluation import TestAccuracy


@dataclass
class EpochResult:
    loss: float
    accuracy: float
    images: int  # global
    seconds: float
    bad_records: int  # global
    bad_keys: list  # this process's first BAD_KEYS_NAMED


class EpochTotals:
    """An epoch's totals on this process as it goes: its loss x images and correct predictions on
    the device (read once, at the end: a read each step would stall the GPU's queue), its images
    and bad records, and the first BAD_KEYS_NAMED bad keys, to name."""

    def __init__(self, device: torch.device):
        self.on_device = torch.zeros(2, dtype=torch.float64, device=device)
        self.images = self.bad = 0
        self.bad_keys: list = []

    def add(self, loss: torch.Tensor, correct: torch.Tensor, images: int, bad_keys: list) -> None:
        self.on_device += torch.stack([loss.detach().double() * images, correct.double()])
        self.images, self.bad = self.images + images, self.bad + len(bad_keys)
        self.bad_keys += bad_keys[: BAD_KEYS_NAMED - len(self.bad_keys)]

    def sums(self, device: torch.device) -> torch.Tensor:
        """Loss x images, correct, images, bad records, on `device`."""
        counts = torch.tensor([self.images, self.bad], dtype=torch.float64, device=device)
        return torch.cat([self.on_device.to(device), counts])


def epoch_row(
    result: EpochResult, run: RunState, learning_rate: float, test: TestAccuracy | None
) -> EpochRow:
    """The run log's row of the epoch just done; `learning_rate`, its last step's."""
    return EpochRow(
        time_spent=round(result.seconds, 3),
        cumulative_time_spent=round(run.total_seconds, 3),
        input_count=result.images,
        cumulative_input_count=run.total_images,
        cumulative_batch_count=run.iteration,
        inputs_per_sec=round(result.images / result.seconds, 2),
        accuracy=round(result.accuracy, 6),
        epoch=run.epochs_done,
        learning_rate=learning_rate,
        loss=round(result.loss, 6),
        test_accuracy=NO_TEST_ACCURACY if test is None else round(test.top1, 6),
        top5_test_accuracy=NO_TEST_ACCURACY if test is None else round(test.top5, 6),
    )


def write_row(runlog: RunLog | None, row: EpochRow) -> UserError | None:
    """The row appended to the log (first process); the failure to write it, if any."""
    try:
        if runlog:
            runlog.write(row)
    except UserError as failure:
        return failure
    return None


def test_accuracy_text(test: TestAccuracy | None) -> str:
    if test is None:
        return str(NO_TEST_ACCURACY)
    return f"{test.top1:.4f}, test top-5 {test.top5:.4f} over {test.images} images"


def peak_memory(device: torch.device) -> str:
    if device.type != "cuda":
        return ""
    return f", peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB"
