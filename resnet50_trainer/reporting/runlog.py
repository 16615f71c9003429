"""The per-run CSV log, named after the run's parameters, in the original's format."""

from __future__ import annotations

import argparse
import contextlib
import csv
import errno
import io
import os
import time
from dataclasses import dataclass, fields

from resnet50_trainer.config.settings import Config
from resnet50_trainer.errors import UserError

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
    """Created exclusively, so an existing log is never overwritten; a row is on disk per epoch.

    A write that fails (disk full, quota) is a UserError naming the log and the reason; the rows
    already written stay intact (a partly written row is cut off again), and a log this run made
    but could not write its header into is removed."""

    def __init__(self, config: Config, started: float):
        self.columns = log_columns(config)
        stem, suffix = os.path.splitext(log_file_name(config, started))
        self.path = os.path.join(config.log_dir, stem + suffix)
        attempt = 1
        while True:
            try:
                self._descriptor = os.open(
                    self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644
                )
                break
            except FileExistsError:  # another run started in the same second
                attempt += 1
                self.path = os.path.join(config.log_dir, f"{stem}_{attempt}{suffix}")
            except OSError as error:
                raise self._failed(error, "") from error
        # The original's first line: '# ' and the parsed arguments, as argparse prints them.
        try:
            self._append(f"# {argparse.Namespace(**config.to_dict())}\n", self.columns)
        except UserError:
            self.discard()
            raise

    def write(self, row: EpochRow) -> None:
        self._append("", [getattr(row, column) for column in self.columns])

    def close(self) -> None:
        os.close(self._descriptor)

    def discard(self) -> None:
        """Closed and removed: the log of a run that ends before its first row."""
        self.close()
        with contextlib.suppress(OSError):  # the error that ended the run is the one to report
            os.unlink(self.path)

    def _append(self, text: str, row) -> None:
        """`text` and a CSV row, synced to disk, or nothing of them."""
        lines = io.StringIO()
        lines.write(text)
        csv.writer(lines, lineterminator="\n").writerow(row)
        remaining = memoryview(lines.getvalue().encode())
        size = os.fstat(self._descriptor).st_size
        try:
            while remaining:
                remaining = remaining[os.write(self._descriptor, remaining) :]
            os.fsync(self._descriptor)
            if os.fstat(self._descriptor).st_nlink == 0:
                # Writes to a log whose name is gone succeed and vanish with it: every row lost.
                raise FileNotFoundError(errno.ENOENT, "the log was removed while the run wrote it")
        except FileNotFoundError as error:
            raise UserError(
                f"the run log {self.path} is gone ({error.strerror}): its directory "
                "or the file was removed during the run; resume from the last "
                "checkpoint with a --log_dir that stays"
            ) from error
        except OSError as error:
            with contextlib.suppress(OSError):  # the write's error is the one to report
                os.ftruncate(self._descriptor, size)
            raise self._failed(error, "; the rows already written are intact") from error

    def _failed(self, error: OSError, kept: str) -> UserError:
        return UserError(
            f"writing the run log {self.path} failed ({error.strerror}): "
            f"free space in --log_dir or choose another{kept}"
        )
