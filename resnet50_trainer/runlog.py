"""The per-run CSV log, named after the run's parameters, in the original's format."""

from __future__ import annotations

import argparse
import csv
import os
import time
from dataclasses import astuple, dataclass, fields

from resnet50_trainer.config import Config


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


HEADER = [field.name for field in fields(EpochRow)]
NO_TEST_ACCURACY = -1


def log_file_name(config: Config, started: float) -> str:
    stamp = time.strftime("%Y%m%d_%H%M%S", time.localtime(started))
    return (f"resnet50_gpu{config.num_gpus}_b{config.batch_size}_L{config.num_labels}"
            f"_lr{config.base_learning_rate:.2f}_v2_{stamp}.log")


class RunLog:
    """Created exclusively, so an existing log is never overwritten; a row is flushed per epoch."""

    def __init__(self, config: Config, started: float):
        stem, suffix = os.path.splitext(log_file_name(config, started))
        self.path = os.path.join(config.log_dir, stem + suffix)
        attempt = 1
        while True:
            try:
                self._file = open(self.path, "x", newline="")
                break
            except FileExistsError:  # another run started in the same second
                attempt += 1
                self.path = os.path.join(config.log_dir, f"{stem}_{attempt}{suffix}")
        # The original's first line: '# ' and the parsed arguments, as argparse prints them.
        self._file.write(f"# {argparse.Namespace(**config.to_dict())}\n")
        self._writer = csv.writer(self._file, lineterminator="\n")
        self._writer.writerow(HEADER)
        self._file.flush()

    def write(self, row: EpochRow) -> None:
        self._writer.writerow(astuple(row))
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()
