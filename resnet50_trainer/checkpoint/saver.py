"""Checkpoints of the run as it goes: the first process writes, every process waits at the
checkpoint barrier and learns whether the write failed, so all stop together."""

from __future__ import annotations

import os

import torch

from resnet50_trainer.checkpoint import files as checkpoint_files
from resnet50_trainer.checkpoint import grad_compression_entry, ownership, schema
from resnet50_trainer.checkpoint.run_state import RunState
from resnet50_trainer.config.settings import Config
from resnet50_trainer.distributed import process_group
from resnet50_trainer.distributed.stopping import stop_together
from resnet50_trainer.errors import Diverged, UserError
from resnet50_trainer.model.finite import non_finite_tensors
from resnet50_trainer.model.replica import Learner
from resnet50_trainer.path_words import shown


class CheckpointSaver:
    def __init__(self, config: Config, learner: Learner, lineage: str):
        self.config, self.placement, self.device = config, learner.placement, learner.device
        self.replica, self.schedule = learner.replica, learner.schedule
        self.lineage = lineage  # of this run's checkpoints: retention deletes only those

    def save(
        self, run: RunState, epoch_sums: torch.Tensor | None = None, epoch_seconds: float = 0.0
    ) -> str | None:
        """The checkpoint of `run`, on every process; its path on the first. Within an epoch,
        `epoch_sums` are the epoch's global sums so far. No process runs ahead of a saved step."""
        path, failure = None, None
        # Every process: PowerSGD's error feedback is gathered to the first.
        compression = grad_compression_entry.checkpoint_entry(
            self.replica.compression, self.placement, self.device
        )
        if self.placement.is_main:
            config = self.config
            path = checkpoint_files.checkpoint_path(
                config.checkpoint_dir, config.save_model_name, run.epochs_done, run.steps_into_epoch
            )
            try:
                self._write(path, run, epoch_sums, epoch_seconds, compression)
            except (UserError, Diverged) as error:
                failure = error
        # Also the barrier after the write: no process runs ahead of a saved step. The others
        # wait there as long as the write takes: --first_iter_timeout, not --timeout.
        with process_group.long_wait(self.config):
            stop_together(failure, self.device, "the checkpoint barrier")
        return path

    def _write(
        self,
        path: str,
        run: RunState,
        epoch_sums: torch.Tensor | None,
        epoch_seconds: float,
        compression: dict,
    ) -> None:
        """Never over good weights with diverged ones: non-finite weights end the run instead."""
        config, replica = self.config, self.replica
        parts = replica.checkpoint_entries()
        diverged = non_finite_tensors(parts["model"])
        if diverged:
            more = f" and {len(diverged) - 1} more" if len(diverged) > 1 else ""
            raise Diverged(
                f"the weights are no longer finite at epoch "
                f"{run.epochs_done + (1 if run.steps_into_epoch else 0)}, iteration "
                f"{run.iteration} ({diverged[0]}{more}): {os.path.basename(path)} was "
                f"not written and the checkpoints in {shown(config.checkpoint_dir)} are "
                "intact; resume from the last one with a lower --base_learning_rate"
            )
        settings = schema.settings_entry(
            config,
            self.placement.world_size,
            self.lineage,
            self.schedule(run.iteration),  # the LR of the next step
        )
        checkpoint_files.save_checkpoint(
            schema.compose(
                parts,
                run.checkpoint_entry(epoch_sums, epoch_seconds),
                {"grad_compression": compression},
                settings,
            ),
            path,
        )
        ownership.remove_older(
            config.checkpoint_dir,
            config.save_model_name,
            config.keep_checkpoints,
            self.lineage,
            path,
        )
