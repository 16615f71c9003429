"""What an epoch reports: its result, its row of the run log (and the log's write failure as a
verdict, so every process stops together), and the words of the console's epoch line."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from resnet50_trainer.checkpoint.run_state import RunState
from resnet50_trainer.errors import UserError
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
