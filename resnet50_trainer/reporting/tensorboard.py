"""--tensorboard: the run's curves as TensorBoard event files (torch.utils.tensorboard), written by
the first process next to the run log, in <log_dir>/tensorboard/<save_model_name>_<lineage>/.

Per epoch, what the run log's row holds (loss, accuracy, test top-1 and top-5, learning rate,
images/s) and the EMA's test accuracy; every --print_every steps, what the console prints then
(the training loss and accuracy of that step) with its learning rate and the share of time spent
waiting for input. The step of every point is the global iteration, and a resumed run (the same
lineage, so the same directory) continues the same curves from the checkpoint's iteration: points
a stopped run wrote past it are purged, as TensorBoard does for a restarted job. Nothing here
reads the device: the values are the ones the console and the log already read."""

from __future__ import annotations

import os

from resnet50_trainer.config.settings import Config
from resnet50_trainer.errors import UserError
from resnet50_trainer.reporting.runlog import NO_TEST_ACCURACY, EpochRow

SUBDIRECTORY = "tensorboard"


def event_directory(config: Config, lineage: str) -> str:
    """One directory per run, resumes included: the checkpoints' lineage names it."""
    return os.path.join(
        config.log_dir, SUBDIRECTORY, f"{config.save_model_name}_{lineage[:8] or 'unmarked'}"
    )


class TensorBoardLog:
    def __init__(self, directory: str, first_iteration: int):
        """`first_iteration`: the global iteration the run starts at (0, or a resume's)."""
        from torch.utils.tensorboard import SummaryWriter  # tensorboard: only with the flag

        self.directory = directory
        try:
            # purge_step: a resume drops what an earlier process wrote past its checkpoint (the
            # checkpoint's own iteration, an epoch's end, keeps its points).
            self.writer = SummaryWriter(
                directory, purge_step=first_iteration + 1 if first_iteration else None
            )
        except OSError as error:
            raise UserError(
                f"--tensorboard cannot write its event files in {directory} "
                f"({error.strerror or error}): make --log_dir writable or leave --tensorboard out"
            ) from error

    def step(
        self, iteration: int, loss: float, accuracy: float, learning_rate: float, input_wait: float
    ) -> None:
        """A --print_every step's values, at global `iteration`."""
        for tag, value in (
            ("train/loss", loss),
            ("train/accuracy", accuracy),
            ("train/learning_rate", learning_rate),
            ("train/input_wait_share", input_wait),
        ):
            self.writer.add_scalar(tag, value, iteration)

    def epoch(self, row: EpochRow, ema_test_accuracy: float | None) -> None:
        """An epoch's row of the run log, at the global iteration it ended on; on disk after."""
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
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, row.cumulative_batch_count)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
