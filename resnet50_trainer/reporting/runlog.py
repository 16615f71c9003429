"""The per-run CSV log, named after the run's parameters, in the original's format."""

from __future__ import annotations

import argparse
import csv
import io
import os
import time
from dataclasses import dataclass, fields

from resnet50_trainer.config.settings import Config
from resnet50_trainer.errors import UserError
from resnet50_trainer.reporting.report_files import ReportFile, write_failure

NO_TEST_ACCURACY = -1
# The later original's name for it; a log column only with --log_top5.
TOP5_COLUMN = "top5_test_accuracy"


@dataclass(frozen=True)
class EpochRow:
    """One row per epoch; counts are global (all processes of all shards)."""

    time_spent: float
    cumulative_time_spent: float
    input_count: int
    cumulative_input_count: int
    cumulative_batch_count: int
    inputs_per_sec: float
    accuracy: float
    epoch: int
    learning_rate: float
    loss: float
    test_accuracy: float  # -1 without --test_data, as the original
    top5_test_accuracy: float = NO_TEST_ACCURACY


# The original's columns; --log_top5 adds TOP5_COLUMN after them.
HEADER = [field.name for field in fields(EpochRow) if field.name != TOP5_COLUMN]


def log_columns(config: Config) -> list[str]:
    return HEADER + [TOP5_COLUMN] if config.log_top5 else HEADER


def log_file_name(config: Config, started: float) -> str:
    """The original's name; a ResNeXt's starts with resnext{depth}, as the later original's did."""
    stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(started))
    model = f"resnext{config.num_layers}" if config.resnext else "resnet50"
    return (
        f"{model}_gpu{config.processes_per_machine}_b{config.batch_size}_L{config.num_labels}"
        f"_lr{config.base_learning_rate:.2f}_v2_{stamp}.log"
    )


class RunLog:
    """Created exclusively, so an existing log is never overwritten; a row is on disk per epoch
    (report_files.py: a write that fails is one line, the rows already written intact); a log
    this run made but could not write its header into is removed."""

    def __init__(self, config: Config, started: float):
        self.columns = log_columns(config)
        stem, suffix = os.path.splitext(log_file_name(config, started))
        path = os.path.join(config.log_dir, stem + suffix)
        attempt = 1
        while True:
            try:
                self._file = ReportFile(path, "the run log", "rows")
                break
            except FileExistsError:  # another run started in the same second
                attempt += 1
                path = os.path.join(config.log_dir, f"{stem}_{attempt}{suffix}")
            except OSError as error:
                raise write_failure("the run log", path, error) from error
        self.path = path
        # The original's first line: '# ' and the parsed arguments, as argparse prints them.
        try:
            self._append(f"# {argparse.Namespace(**config.to_dict())}\n", self.columns)
        except UserError:
            self.discard()
            raise

    def write(self, row: EpochRow) -> None:
        self._append("", [getattr(row, column) for column in self.columns])

    def close(self) -> None:
        self._file.close()

    def discard(self) -> None:
        """Closed and removed: the log of a run that ends before its first row."""
        self._file.discard()

    def _append(self, text: str, row) -> None:
        """`text` and a CSV row, synced to disk, or nothing of them."""
        lines = io.StringIO()
        lines.write(text)
        csv.writer(lines, lineterminator="\n").writerow(row)
        try:
            self._file.append(lines.getvalue().encode())
        except OSError as error:
            raise self._file.failure(error) from error
