"""--tensorboard: the run's curves as TensorBoard event files, written by the first process next to
the run log, in <log_dir>/tensorboard/<save_model_name>_<lineage>/.

Per epoch, what the run log's row holds (loss, accuracy, test top-1 and top-5, learning rate,
images/s) and the EMA's test accuracy; every --print_every steps, what the console prints then
(the training loss and accuracy of that step) with its learning rate and the share of time spent
waiting for input. The step of every point is the global iteration, and a resumed run (the same
lineage, so the same directory) continues the same curves from the checkpoint's iteration: points
a stopped run wrote past it are purged, as TensorBoard does for a restarted job. Nothing here
reads the device: the values are the ones the console and the log already read."""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import socket
import time

from resnet50_trainer.config.settings import Config
from resnet50_trainer.errors import UserError
from resnet50_trainer.path_words import shown
from resnet50_trainer.reporting.report_files import ReportFile
from resnet50_trainer.reporting.runlog import NO_TEST_ACCURACY, EpochRow

SUBDIRECTORY = "tensorboard"
_EVENT_FILES = itertools.count()  # a process's event files, as TensorBoard's own writer counts


def event_directory(config: Config, lineage: str) -> str:
    """One directory per run, resumes included: the checkpoints' lineage names it."""
    return os.path.join(
        config.log_dir, SUBDIRECTORY, f"{config.save_model_name}_{lineage[:8] or 'unmarked'}"
    )


class TensorBoardLog:
    """An event file of TensorBoard's format (its Event protos, each a record of its framing),
    written here and now rather than by TensorBoard's own writer, whose thread reports a failed
    write as a traceback of its own: a report file as the run log is (report_files.py). A write
    that fails ends the run at the epoch's end, once its checkpoint is saved (`epoch` returns the
    failure); the points after it are not written."""

    def __init__(self, directory: str, first_iteration: int):
        """`first_iteration`: the global iteration the run starts at (0, or a resume's). Where
        the file cannot be started, UserError, and nothing of it or its folders is left."""
        self.directory = directory
        self.failure: UserError | None = None
        made = _missing_folders(directory)
        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
            f"{os.getpid()}.{next(_EVENT_FILES)}"
        )
        try:
            os.makedirs(directory, exist_ok=True)
            self._file = ReportFile(
                os.path.join(directory, name), "TensorBoard's event file", "points"
            )
            try:
                self._file.append(_records(_opening_events(first_iteration)))
            except OSError:
                self._file.discard()
                raise
        except OSError as error:
            for folder in reversed(made):
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
            raise UserError(
                f"--tensorboard cannot write its event files in {shown(directory)} "
                f"({error.strerror or error}): make --log_dir writable, with room, or leave "
                "--tensorboard out"
            ) from error

    def step(
        self, iteration: int, loss: float, accuracy: float, learning_rate: float, input_wait: float
    ) -> None:
        """A --print_every step's values, at global `iteration`."""
        values = {
            "train/loss": loss,
            "train/accuracy": accuracy,
            "train/learning_rate": learning_rate,
            "train/input_wait_share": input_wait,
        }
        self._write(iteration, values, sync=False)

    def epoch(self, row: EpochRow, ema_test_accuracy: float | None) -> UserError | None:
        """An epoch's row of the run log, at the global iteration it ended on; on disk after.
        The failure of this write or of an earlier one, if any."""
        values = {
            "epoch/loss": row.loss,
            "epoch/accuracy": row.accuracy,
            "epoch/learning_rate": row.learning_rate,
            "epoch/images_per_sec": row.inputs_per_sec,
        }
        if row.test_accuracy != NO_TEST_ACCURACY:
            values["epoch/test_accuracy"] = row.test_accuracy
            values["epoch/test_top5_accuracy"] = row.top5_test_accuracy
        if ema_test_accuracy is not None:
            values["epoch/ema_test_accuracy"] = ema_test_accuracy
        self._write(row.cumulative_batch_count, values, sync=True)
        return self.failure

    def close(self) -> None:
        self._file.close()

    def _write(self, iteration: int, values: dict[str, float], sync: bool) -> None:
        """The values as one event at `iteration`; after a failed write, nothing."""
        if self.failure is not None:
            return
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(
            value=[Summary.Value(tag=tag, simple_value=value) for tag, value in values.items()]
        )
        try:
            self._file.append(_records([Event(step=iteration, summary=summary)]), sync)
        except OSError as error:
            self.failure = self._file.failure(error)


def _opening_events(first_iteration: int) -> list:
    """The file's version; from a resume, the start of a session at its iteration + 1, which
    makes TensorBoard purge the points an earlier process wrote past the checkpoint (the
    checkpoint's own iteration, an epoch's end, keeps its points), as for a restarted job."""
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    opening = [Event(file_version="brain.Event:2")]
    if first_iteration:
        opening.append(
            Event(step=first_iteration + 1, session_log=SessionLog(status=SessionLog.START))
        )
    return opening


def _records(events: list) -> bytes:
    """Events stamped now, each framed as TensorBoard's reader reads a record."""
    from tensorboard.summary.writer.record_writer import RecordWriter

    framed = io.BytesIO()
    writer = RecordWriter(framed)
    for event in events:
        event.wall_time = time.time()
        writer.write(event.SerializeToString())
    return framed.getvalue()


def _missing_folders(directory: str) -> list[str]:
    """The folders on the way to `directory`, itself included, that do not exist yet, from the
    outermost."""
    missing: list[str] = []
    while directory and not os.path.exists(directory):
        missing.insert(0, directory)
        directory = os.path.dirname(directory)
    return missing
