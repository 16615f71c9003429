"""Continuing a run from its checkpoint exactly: weights, momentum, the run's position and
totals, the LR and the data order. The order and augmentation are functions of (seed, epoch, step,
position) (data/order.py), so the seed and the position restore them; nothing after the weights
are drawn consumes torch's generator, so its state is not needed."""

from __future__ import annotations

import logging
import math

import torch.distributed as dist

from resnet50_trainer.checkpoint import files as checkpoint_files
from resnet50_trainer.checkpoint import grad_compression_entry, ownership, schema
from resnet50_trainer.checkpoint.run_state import RunState
from resnet50_trainer.config.lr_policies import POLICIES
from resnet50_trainer.config.settings import Config
from resnet50_trainer.distributed import process_group
from resnet50_trainer.distributed.process_group import Placement
from resnet50_trainer.distributed.stopping import stop_run
from resnet50_trainer.errors import UserError, exit_status
from resnet50_trainer.model.ema import restore_ema
from resnet50_trainer.model.lr_schedule import LearningRateSchedule
from resnet50_trainer.model.replica import Replica

log = logging.getLogger(__name__)


def resume(
    path: str | None,
    config: Config,
    placement: Placement,
    replica: Replica,
    schedule: LearningRateSchedule,
    steps_per_epoch: int,
) -> tuple[RunState, str]:
    """Load the checkpoint at `path` (or the newest usable one in that directory) into `replica`;
    returns the run's state to continue from and the lineage the run goes on with. `path` None:
    --auto_resume found nothing to continue, and this process starts a new run, once every
    process agrees."""
    state = (
        None
        if path is None
        else checkpoint_files.load_checkpoint(path, config.save_model_name, warn=placement.is_main)
    )
    differ = _resumes_differ(state, placement.world_size)
    if differ is not None:
        stop_run(differ if placement.is_main else None, exit_status(differ))
    if state is None:
        return RunState(), schema.new_lineage()
    schema.check_matches(state, config)
    schema.check_fits(state, replica.model, replica.optimizer)
    _load_into(replica, state)
    restore_ema(replica.ema, state.get("ema"), replica.model, state["path"], placement.is_main)
    run = RunState.from_checkpoint(state)
    run.steps_into_epoch, run.iteration = continue_with_global_batch(
        state, config, placement.world_size, steps_per_epoch, warn=placement.is_main
    )
    _end_epoch_beyond_its_steps(run, steps_per_epoch, state["path"], placement.is_main)
    grad_compression_entry.restore(
        replica.compression, state, run.iteration, placement, replica.model, config
    )
    if placement.is_main:
        warn_of_changes(state, config, schedule(run.iteration))
    log.info(
        "Resumed from %s: epoch %d done, %d steps into epoch %d, iteration %d, next LR %.5g",
        state["path"],
        run.epochs_done,
        run.steps_into_epoch,
        run.epochs_done + 1,
        run.iteration,
        schedule(run.iteration),
    )
    return run, ownership.lineage_of(state, config.checkpoint_dir)


def _resumes_differ(state: dict | None, world_size: int) -> UserError | None:
    """Every process continues the same checkpoint (or none): machines with disks of their own may
    hold different newest ones (or none), and the replicas would part silently."""
    everyone: list = [None] * world_size
    with process_group.waiting_for_peers("the comparison of the resumed checkpoints"):
        dist.all_gather_object(everyone, state and schema.position(state))
    differing = [rank for rank, theirs in enumerate(everyone) if theirs != everyone[0]]
    if not differing:
        return None
    return UserError(
        f"the processes would resume different checkpoints (rank 0: "
        f"{_resumed(everyone[0], state)}; rank {differing[0]}: "
        f"{_resumed(everyone[differing[0]])}): give every machine the same checkpoint, e.g. "
        "a --load_model_path file or --checkpoint_dir on shared storage"
    )


def _resumed(position: tuple | None, state: dict | None = None) -> str:
    if position is None:
        return "none, a new run"
    epoch, step, _, _ = position
    return f"{state['path'] + ', ' if state else ''}{epoch} epochs and {step} steps done"


def _load_into(replica: Replica, state: dict) -> None:
    try:
        replica.load_checkpoint_entries(state)
    except (RuntimeError, ValueError, KeyError, TypeError) as error:
        raise UserError(
            f"checkpoint {state['path']} cannot be loaded into this run "
            f"({checkpoint_files.describe_error(error)}): give a checkpoint written by "
            "resnet50-trainer for this model"
        ) from error


def _end_epoch_beyond_its_steps(run: RunState, steps: int, path: str, warn: bool) -> None:
    """A mid-epoch checkpoint past the end of this run's shorter epoch (another --epoch_size or
    a smaller DB): that epoch ends at once, with the sums it had."""
    if run.steps_into_epoch < steps:
        return
    if warn:
        log.warning(
            "Checkpoint %s is %d steps into epoch %d, but this run's epochs have %d "
            "steps (--epoch_size or the DB changed): epoch %d ends without another "
            "step and the run goes on with epoch %d",
            path,
            run.steps_into_epoch,
            run.epochs_done + 1,
            steps,
            run.epochs_done + 1,
            run.epochs_done + 2,
        )
    run.steps_into_epoch = steps


def continue_with_global_batch(
    state: dict, config: Config, world_size: int, steps_per_epoch: int, warn: bool = True
) -> tuple[int, int]:
    """(step in the epoch, global iteration) to continue from. A checkpoint made with another
    global batch continues with this run's: the record stream is the same, cut into this run's
    batches from the position reached. `warn`: say so (the first process does)."""
    saved_world, saved_batch = state["world_size"], state["global_batch_size"]
    if saved_world != world_size and warn:
        log.warning(
            "Checkpoint made with %d processes, resuming on %d: each process now takes "
            "%d of every global batch of %d",
            saved_world,
            world_size,
            config.device_batch_size,
            config.global_batch_size,
        )
    if saved_batch == config.global_batch_size:
        return state["step"], state["iteration"]
    position = state["step"] * saved_batch
    step = position // config.global_batch_size
    iteration = state["epoch"] * steps_per_epoch + step
    reread = position % config.global_batch_size
    if warn:
        log.warning(
            "Global batch changes from %d to %d: the record order follows the new "
            "batch from epoch %d step %d (iteration %d)%s",
            saved_batch,
            config.global_batch_size,
            state["epoch"] + 1,
            step,
            iteration,
            f"; {reread} records of the interrupted step are read again" if reread else "",
        )
    return step, iteration


def warn_of_changes(state: dict, config: Config, learning_rate: float) -> None:
    """A resume never changes the LR or the data order silently."""
    if state["seed"] != config.seed:
        log.warning(
            "--seed %d differs from the checkpoint's %d: the record order and crops "
            "from here on differ from the interrupted run's",
            config.seed,
            state["seed"],
        )
    if not math.isclose(learning_rate, state["learning_rate"], rel_tol=1e-9):
        log.warning(
            "The learning rate changes on resume from %.6g to %.6g: this run's "
            "--base_learning_rate, --lr_scaling, --lr_policy (or its --lr_* flags), "
            "--num_epochs (%s), --batch_size or --warmup_epochs differ from the checkpoint's",
            state["learning_rate"],
            learning_rate,
            ", ".join(policy.name for policy in POLICIES if policy.by_run_length),
        )
