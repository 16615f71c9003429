"""Run logs written for the plot tests: rows in LOG_COLUMNS' order, ours (with and without test
rows) and the original's."""

from __future__ import annotations

from pathlib import Path

from resnet50_trainer.tools.plot.logfile import LOG_COLUMNS

HEADER = ",".join(LOG_COLUMNS)
OURS_NAME = "resnet50_gpu2_b64_L1000_lr0.10_v2_20261121_101530.log"


NO_TEST = -1


def row(
    epoch: int,
    loss: float | str,
    accuracy: float,
    test_accuracy: float,
    learning_rate: object = 0.1,
) -> str:
    """One log row: the order of LOG_COLUMNS, counts consistent with 1280 images per epoch."""
    counts = [10.0, 10.0 * epoch, 1280, 1280 * epoch, 40 * epoch, 128.0]
    values = counts + [accuracy, epoch, learning_rate, loss, test_accuracy]
    return ",".join(str(value) for value in values)


def write_log(
    path: Path,
    rows: list[str],
    arguments: str | None = "--train_data /data/train",
    header: str = HEADER,
) -> Path:
    lines = ([f"# {arguments}"] if arguments is not None else []) + [header] + rows
    path.write_text("\n".join(lines) + "\n")
    return path


def ours_log(directory: Path, name: str = OURS_NAME) -> Path:
    """Our trainer's log with test data, one evaluation (epoch 2) skipped."""
    rows = [row(1, 6.8, 0.1, 0.08), row(2, 6.1, 0.2, NO_TEST), row(3, 5.5, 0.3, 0.25)]
    return write_log(directory / name, rows)
