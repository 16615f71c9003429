"""Checkpoints: written atomically, loaded safely, named after the epoch (and step) they end at.

`{save_model_name}_{E}.pt` is the end of epoch E (1-based, as the original); a checkpoint taken
within an epoch by --checkpoint_every_iters is `{save_model_name}_{E}_step{S}.pt`: E epochs done
and S steps into the next. A checkpoint is a dict of state dicts, numbers and plain settings only,
so it loads with torch.load(weights_only=True) and never unpickles arbitrary objects. The model's
keys are torchvision's (no `module.` prefix), so the weights load into torchvision's resnet as
they are.
"""

from __future__ import annotations

import io
import logging
import math
import os
import re
import tempfile
import time
from typing import NamedTuple, Optional

import torch

from resnet50_trainer.config import Config
from resnet50_trainer.errors import UserError

log = logging.getLogger(__name__)

SUFFIX = ".pt"
TEMPORARY_PREFIX = ".tmp-"
# Fault-injection hook for tests: seconds to sleep between the fsync and the rename, so a test can
# kill the writer while the new checkpoint exists only as a temporary file.
PAUSE_BEFORE_RENAME_ENV = "RESNET50_TRAINER_TEST_PAUSE_BEFORE_RENAME"
# What a resume needs (train.Trainer.save writes them all).
REQUIRED_KEYS = frozenset({"model", "optimizer", "epoch", "step", "iteration", "learning_rate",
                           "seed", "torch_rng_state", "global_batch_size", "epoch_sums",
                           "epoch_seconds", "total_seconds", "total_images", "arguments",
                           "world_size"})
_NAME = re.compile(r"(?P<stem>.+)_(?P<epoch>\d+)(?:_step(?P<step>\d+))?" + re.escape(SUFFIX) + "$")


class Saved(NamedTuple):
    """A checkpoint file in a directory; ordered by how far into the run it is."""

    epoch: int  # epochs completed
    step: int  # steps into the next epoch; 0 at an epoch's end
    path: str


def checkpoint_path(directory: str, name: str, epoch: int, step: int = 0) -> str:
    return os.path.join(directory, f"{name}_{epoch}{f'_step{step}' if step else ''}{SUFFIX}")


def save_checkpoint(state: dict, path: str) -> None:
    """Temporary file, fsync, rename, fsync of the directory: a crash leaves the old file or the new.

    The state is serialized in memory first, so a failed write (disk full, quota) surfaces as the
    OSError it is, not as torch's stream-writer error; it removes the temporary file and raises
    UserError, and the checkpoints already in place are untouched.
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=f"{TEMPORARY_PREFIX}{os.path.basename(path)}-",
                                         suffix=SUFFIX, dir=directory)
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(buffer.getbuffer())
            file.flush()
            os.fsync(file.fileno())
        time.sleep(float(os.environ.get(PAUSE_BEFORE_RENAME_ENV, 0)))
        os.replace(temporary, path)
    except BaseException as error:
        os.unlink(temporary)
        if isinstance(error, OSError):
            raise UserError(f"writing checkpoint {path} failed ({error.strerror}): free space in "
                            "--checkpoint_dir or choose another; the checkpoints already there "
                            "are intact") from error
        raise
    _fsync_directory(directory)


def load_checkpoint(path: str) -> dict:
    """The checkpoint at `path`, or the newest one in `path` when it is a directory."""
    if os.path.isdir(path):
        saved = saved_checkpoints(path)
        if not saved:
            raise UserError(f"--load_model_path {path} is a directory without checkpoints "
                            f"(*_<epoch>{SUFFIX}): give a checkpoint file or the --checkpoint_dir "
                            "of an earlier run")
        path = saved[-1].path
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UserError(f"--load_model_path {path} does not exist: give a checkpoint file "
                        "written by resnet50-trainer") from None
    except Exception as error:  # torch raises several types for a file that is not a checkpoint
        raise UserError(f"--load_model_path {path} is not a readable checkpoint ({type(error).__name__}): "
                        "give a .pt file written by resnet50-trainer") from error
    missing = REQUIRED_KEYS - state.keys() if isinstance(state, dict) else REQUIRED_KEYS
    if missing:
        raise UserError(f"--load_model_path {path} lacks {', '.join(sorted(missing))}: it is no "
                        "resnet50-trainer checkpoint, or one too old to resume exactly; give a "
                        "checkpoint written by this version")
    state["path"] = path
    return state


def check_matches(state: dict, config: Config) -> None:
    """A checkpoint of another architecture or label count cannot continue this run."""
    saved = state.get("arguments", {})
    for name in ("num_layers", "num_labels", "num_channels"):
        if saved.get(name) != getattr(config, name):
            raise UserError(f"checkpoint {state['path']} was made with --{name} {saved.get(name)}, "
                            f"this run has {getattr(config, name)}: use the same value or another "
                            "checkpoint")


def continue_with_global_batch(state: dict, config: Config, world_size: int,
                               steps_per_epoch: int) -> tuple[int, int]:
    """(step in the epoch, global iteration) to continue from. A checkpoint made with another
    global batch continues with this run's: the record stream is the same, cut into this run's
    batches from the position reached."""
    saved_world, saved_batch = state["world_size"], state["global_batch_size"]
    if saved_world != world_size:
        log.warning("Checkpoint made with %d processes, resuming on %d: each process now takes "
                    "%d of every global batch of %d", saved_world, world_size,
                    config.device_batch_size, config.global_batch_size)
    if saved_batch == config.global_batch_size:
        return state["step"], state["iteration"]
    position = state["step"] * saved_batch
    step = position // config.global_batch_size
    iteration = state["epoch"] * steps_per_epoch + step
    reread = position % config.global_batch_size
    log.warning("Global batch changes from %d to %d: the record order follows the new batch "
                "from epoch %d step %d (iteration %d)%s", saved_batch, config.global_batch_size,
                state["epoch"] + 1, step, iteration,
                f"; {reread} records of the interrupted step are read again" if reread else "")
    return step, iteration


def warn_of_changes(state: dict, config: Config, learning_rate: float) -> None:
    """A resume never changes the LR or the data order silently."""
    if state["seed"] != config.seed:
        log.warning("--seed %d differs from the checkpoint's %d: the record order and crops "
                    "from here on differ from the interrupted run's", config.seed, state["seed"])
    if not math.isclose(learning_rate, state["learning_rate"], rel_tol=1e-9):
        log.warning("The learning rate changes on resume from %.6g to %.6g: this run's "
                    "--base_learning_rate, --batch_size or --warmup_epochs differ from the "
                    "checkpoint's", state["learning_rate"], learning_rate)


def saved_checkpoints(directory: str, name: Optional[str] = None) -> list[Saved]:
    """Complete checkpoints in `directory` (of stem `name`, or any), oldest first. Temporary files
    of an interrupted write are never listed."""
    saved = []
    for entry in os.listdir(directory):
        match = _NAME.match(entry)
        if match and not entry.startswith(TEMPORARY_PREFIX) and name in (None, match["stem"]):
            saved.append(Saved(int(match["epoch"]), int(match["step"] or 0),
                               os.path.join(directory, entry)))
    return sorted(saved)


def remove_older(directory: str, name: str, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints, only after the newest is in place, and the
    temporary files that writers killed mid-write left behind."""
    for saved in saved_checkpoints(directory, name)[:-keep]:
        os.unlink(saved.path)
    for entry in os.listdir(directory):
        if entry.startswith(f"{TEMPORARY_PREFIX}{name}_"):
            os.unlink(os.path.join(directory, entry))


def _fsync_directory(directory: str) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
