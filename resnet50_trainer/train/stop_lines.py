"""The lines a run stopped by a signal ends with (errors.Preempted): where it was, and where its
position is saved; or, where a process waiting for a batch could not save it, why."""

from __future__ import annotations

from resnet50_trainer.checkpoint.files import checkpoint_path
from resnet50_trainer.checkpoint.run_state import RunState
from resnet50_trainer.config.settings import Config
from resnet50_trainer.data.prefetch import StopWhileWaiting
from resnet50_trainer.distributed.preemption import stop_signal_name
from resnet50_trainer.distributed.process_group import Placement
from resnet50_trainer.errors import Preempted
from resnet50_trainer.path_words import shown


def preempted(run: RunState, steps_per_epoch: int, saved: str | None) -> Preempted:
    return Preempted(
        f"stopped by {stop_signal_name()} at iteration {run.iteration} (epoch "
        f"{run.epochs_done + 1}, step {run.steps_into_epoch} of {steps_per_epoch}), saved in "
        f"{shown(saved) if saved else 'no checkpoint'}: "
        "restart with the same flags and --auto_resume to go on from there"
    )


def epoch_checkpoint(config: Config, run: RunState) -> str:
    """The checkpoint of the last epoch's end, on every process (the saver names it on the first
    alone)."""
    return checkpoint_path(config.checkpoint_dir, config.save_model_name, run.epochs_done)


def unsaved_while_waiting(
    stuck: StopWhileWaiting, placement: Placement, run: RunState, config: Config
) -> Preempted | None:
    """A stop while this process waited for a batch that did not come: the line where its
    position cannot be saved (with peers, already in the next step's collectives, past where a
    position can be agreed: that step's forward has moved their BatchNorm statistics; or before
    any step), else None."""
    if placement.world_size == 1 and run.iteration:
        return None
    why = "no step was done yet"
    if run.iteration:
        why = "its peers had begun the next step, past where a position can be agreed"
    return Preempted(
        f"stopped by {stop_signal_name()} while rank {placement.rank} "
        f"waited {stuck.waited_s:g} s for a batch from its input (DataLoader) processes "
        f"(one is stopped or stuck, or the storage stopped answering): {why}, so "
        "nothing was saved; restart with the same flags and --auto_resume to go on "
        f"from the newest checkpoint in {shown(config.checkpoint_dir)}, if one was saved"
    )
