"""Checkpoints: written atomically, loaded safely, named after the epoch (and step) they end at.

`{save_model_name}_{E}.pt` is the end of epoch E (1-based, as the original); a checkpoint taken
within an epoch by --checkpoint_every_iters is `{save_model_name}_{E}_step{S}.pt`: E epochs done
and S steps into the next. A checkpoint is a dict of state dicts, numbers and plain settings only,
so it loads with torch.load(weights_only=True) and never unpickles arbitrary objects. The model's
keys are torchvision's (no `module.` prefix), so the weights load into torchvision's resnet as
they are.

Checkpoints belong to a run: each holds its run's `lineage` (a random id; a resumed run keeps the
one it resumed), and retention deletes only checkpoints of this run's lineage. A lock file
`.{save_model_name}.lock` in the directory, held by one run at a time, keeps a second run from
writing (or cleaning up) the same names.
"""

from __future__ import annotations

import errno
import fcntl
import io
import logging
import math
import os
import re
import tempfile
import uuid
from typing import NamedTuple, Optional

import torch

from resnet50_trainer.config import Config
from resnet50_trainer.errors import UserError

log = logging.getLogger(__name__)
SUFFIX = ".pt"
TEMPORARY_PREFIX = ".tmp-"
# What a resume needs (train.Trainer.save writes them all).
REQUIRED_KEYS = frozenset({"model", "optimizer", "epoch", "step", "iteration", "learning_rate",
                           "seed", "torch_rng_state", "global_batch_size", "epoch_sums",
                           "epoch_seconds", "total_seconds", "total_images", "arguments",
                           "world_size"})
# The type of every field a resume reads; "scaler" and "lineage" may be absent.
_NUMBER = (int, float)
FIELD_TYPES = {"model": dict, "optimizer": dict, "arguments": dict, "scaler": (dict, type(None)),
               "epoch": int, "step": int, "iteration": int, "seed": int, "total_images": int,
               "global_batch_size": int, "world_size": int, "learning_rate": _NUMBER,
               "epoch_seconds": _NUMBER, "total_seconds": _NUMBER,
               "torch_rng_state": torch.Tensor, "epoch_sums": (torch.Tensor, type(None)),
               "lineage": str}
_AT_LEAST = {"global_batch_size": 1, "world_size": 1}  # other numbers: 0
# The lineage of checkpoints written before lineages existed: they count as one run's.
UNMARKED_LINEAGE = ""
_LINEAGE = re.compile(r"[0-9a-f]{32}")  # uuid4().hex
_NAME = re.compile(r"(?P<stem>.+)_(?P<epoch>\d+)(?:_step(?P<step>\d+))?" + re.escape(SUFFIX) + "$")
# tempfile.mkstemp's random part: 8 of [a-z0-9_].
_TEMPORARY_RANDOM = r"-[a-z0-9_]{8}" + re.escape(SUFFIX)


class Saved(NamedTuple):
    """A checkpoint file in a directory; ordered by how far into the run it is."""

    epoch: int  # epochs completed
    step: int  # steps into the next epoch; 0 at an epoch's end
    path: str


class _Unusable(Exception):
    """A checkpoint file that cannot be resumed: what is wrong with it, and the fix."""

    def __init__(self, reason: str, fix: str = "give a checkpoint written by resnet50-trainer"):
        super().__init__(reason)
        self.reason, self.fix = reason, fix


def checkpoint_path(directory: str, name: str, epoch: int, step: int = 0) -> str:
    return os.path.join(directory, f"{name}_{epoch}{f'_step{step}' if step else ''}{SUFFIX}")


def new_lineage() -> str:
    return uuid.uuid4().hex


def save_checkpoint(state: dict, path: str) -> None:
    """Temporary file, fsync, rename, fsync of the directory: a crash leaves the old file or the new.

    The state is serialized in memory first, so a failed write (disk full, quota, a directory gone
    or read-only) surfaces as the OSError it is, not as torch's stream-writer error; it removes the
    temporary file and raises UserError, and the checkpoints already in place are untouched.
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    directory = os.path.dirname(os.path.abspath(path))
    temporary = None
    try:
        handle, temporary = tempfile.mkstemp(prefix=f"{TEMPORARY_PREFIX}{os.path.basename(path)}-",
                                             suffix=SUFFIX, dir=directory)
        with os.fdopen(handle, "wb") as file:
            file.write(buffer.getbuffer())
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        temporary = None
        _fsync_directory(directory)
    except OSError as error:
        raise UserError(f"writing checkpoint {path} failed ({error.strerror or error}): make "
                        "--checkpoint_dir writable, with room for a checkpoint, or choose another; "
                        "the checkpoints already there are intact") from error
    finally:
        if temporary is not None:  # also on KeyboardInterrupt: the write is abandoned
            _remove_if_possible(temporary)


def non_finite_tensors(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors holding a NaN or an infinity. One max-abs reduction
    over all tensors of a device (it cannot overflow), one copy to the host per device."""
    by_device: dict[torch.device, list[tuple[str, torch.Tensor]]] = {}
    for name, tensor in tensors.items():
        if tensor.is_floating_point():
            by_device.setdefault(tensor.device, []).append((name, tensor))
    bad = set()
    for named in by_device.values():
        largest = torch._foreach_norm([tensor for _, tensor in named], ord=math.inf)
        finite = torch.stack(largest).isfinite().tolist()
        bad.update(name for (name, _), ok in zip(named, finite) if not ok)
    return [name for name in tensors if name in bad]


def load_checkpoint(path: str, name: str, warn: bool = True) -> dict:
    """The checkpoint at `path`; when `path` is a directory, the newest one of stem `name` (this
    run's --save_model_name) in it that can be resumed, warning (if `warn`) of each newer one
    skipped and why. Another name's checkpoints in the directory belong to another run."""
    if not os.path.isdir(path):
        try:
            return _read_checkpoint(path)
        except _Unusable as problem:
            raise UserError(f"--load_model_path {path} {problem.reason}: {problem.fix}") from None
    saved = saved_checkpoints(path, name)
    if not saved:
        raise UserError(f"--load_model_path {path} is a directory without checkpoints named "
                        f"{name}_<epoch>{SUFFIX}: give a checkpoint file, or the --checkpoint_dir "
                        "and --save_model_name of an earlier run")
    skipped = []
    for candidate in reversed(saved):
        try:
            state = _read_checkpoint(candidate.path)
        except _Unusable as problem:
            skipped.append((candidate.path, problem.reason))
            continue
        for newer, reason in skipped if warn else ():
            log.warning("Checkpoint %s %s: resuming from %s instead, the newest usable one in %s",
                        newer, reason, candidate.path, path)
        return state
    newest, reason = skipped[0]
    raise UserError(f"--load_model_path {path}: none of its {len(saved)} checkpoints can be "
                    f"resumed (the newest, {newest}, {reason}): give a checkpoint written by "
                    "resnet50-trainer")


def _read_checkpoint(path: str) -> dict:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise _Unusable("does not exist", "give a checkpoint file written by resnet50-trainer") from None
    except Exception as error:  # torch raises several types for a file that is not a checkpoint
        raise _Unusable(f"is not a readable checkpoint ({describe_error(error)})",
                        "give a .pt file written by resnet50-trainer") from None
    missing = REQUIRED_KEYS - state.keys() if isinstance(state, dict) else REQUIRED_KEYS
    if missing:
        raise _Unusable(f"lacks {', '.join(sorted(missing))}",
                        "it is no resnet50-trainer checkpoint, or one too old to resume exactly; "
                        "give a checkpoint written by this version")
    problem = _field_problem(state)
    if problem:
        raise _Unusable(f"has {problem}", "it was not written by resnet50-trainer or was altered; "
                        "give a checkpoint written by resnet50-trainer")
    state["path"] = path
    return state


def _field_problem(state: dict) -> Optional[str]:
    """What is wrong with the fields a resume reads, or None: types, signs and sizes."""
    for field, expected in FIELD_TYPES.items():
        value = state.get(field)
        if field in state and (isinstance(value, bool) or not isinstance(value, expected)):
            return f"field {field} of type {type(value).__name__}"
    for field, expected in FIELD_TYPES.items():
        value, least = state.get(field), _AT_LEAST.get(field, 0)
        if expected in (int, _NUMBER) and (value < least or isinstance(value, float)
                                           and not math.isfinite(value)):
            return f"field {field} = {value}, not a number of at least {least}"
    if not all(isinstance(key, str) and isinstance(value, torch.Tensor)
               for key, value in state["model"].items()):
        return "a model state that is not named tensors"
    if state["torch_rng_state"].dtype != torch.uint8:
        return f"a torch_rng_state of {state['torch_rng_state'].dtype}, not uint8"
    lineage = state.get("lineage")
    if lineage is not None and not _LINEAGE.fullmatch(lineage):
        return f"a lineage {lineage[:40]!r} that new_lineage() never makes"
    return _epoch_sums_problem(state) or _non_finite_problem(state)


def _epoch_sums_problem(state: dict) -> Optional[str]:
    """A mid-epoch checkpoint (step > 0) carries the epoch's sums so far, an epoch's end none; the
    sums are loss x images, correct, images, bad records: finite, not negative, consistent."""
    sums, step = state["epoch_sums"], state["step"]
    if (sums is None) != (step == 0):
        return f"step {step} {'without' if sums is None else 'with'} the epoch's sums"
    if sums is None:
        return None
    if sums.shape != (4,):
        return f"epoch_sums of shape {tuple(sums.shape)}, not (4,)"
    loss, correct, images, bad = sums.tolist()
    if not all(math.isfinite(value) and value >= 0 for value in (loss, correct, images, bad)) \
            or not 1 <= images or correct > images or bad > images:
        return f"epoch_sums {[loss, correct, images, bad]} that no epoch adds up to"
    return None


def _non_finite_problem(state: dict) -> Optional[str]:
    """Weights or momentum that are no longer finite: a resume would only diverge again."""
    momentum = {f"momentum of parameter {index}": entry.get("momentum_buffer")
                for index, entry in state["optimizer"].get("state", {}).items()
                if isinstance(entry, dict)}
    tensors = {**state["model"], **{name: buffer for name, buffer in momentum.items()
                                    if isinstance(buffer, torch.Tensor)}}
    bad = non_finite_tensors(tensors)
    return f"non-finite values in {bad[0]}{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}" \
        if bad else None


def check_matches(state: dict, config: Config) -> None:
    """A checkpoint of another architecture or label count cannot continue this run."""
    saved = state.get("arguments", {})
    for name in ("num_layers", "num_labels", "num_channels"):
        if saved.get(name) != getattr(config, name):
            raise UserError(f"checkpoint {state['path']} was made with --{name} {saved.get(name)}, "
                            f"this run has {getattr(config, name)}: use the same value or another "
                            "checkpoint")


def check_fits(state: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Every saved tensor has the shape of this run's: one line, not load_state_dict's traceback
    or a momentum buffer that fails at the first step. Shapes only, so a model on the meta device
    serves as well."""
    expected, saved = model.state_dict(), state["model"]
    unknown = sorted(saved.keys() - expected.keys()) or sorted(expected.keys() - saved.keys())
    wrong = [name for name in expected if name in saved and saved[name].shape != expected[name].shape]
    if unknown:
        problem = f"model tensor {unknown[0]} {'unknown to' if unknown[0] in saved else 'missing for'} this model"
    elif wrong:
        problem = (f"model tensor {wrong[0]} of shape {tuple(saved[wrong[0]].shape)}, this "
                   f"model's is {tuple(expected[wrong[0]].shape)}")
    else:
        problem = _optimizer_problem(state["optimizer"], optimizer)
    if problem:
        raise UserError(f"checkpoint {state['path']} has {problem}: it was not made for this "
                        "model; give a checkpoint of this run's --num_layers, --num_labels and "
                        "--num_channels")


def _optimizer_problem(saved: dict, optimizer: torch.optim.Optimizer) -> Optional[str]:
    groups, states = saved.get("param_groups"), saved.get("state")
    if not isinstance(groups, list) or not isinstance(states, dict) or not all(
            isinstance(group, dict) and isinstance(group.get("params"), list) for group in groups):
        return "an optimizer state without param_groups and state"
    if [len(group["params"]) for group in groups] != [len(g["params"]) for g in optimizer.param_groups]:
        return "an optimizer of other parameter groups"
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    for index, entry in states.items():
        buffer = entry.get("momentum_buffer") if isinstance(entry, dict) else "not a dict"
        fits = (isinstance(index, int) and 0 <= index < len(parameters)
                and (buffer is None or isinstance(buffer, torch.Tensor)
                     and buffer.shape == parameters[index].shape))
        if not fits:
            return f"an optimizer state (entry {index}) that fits no parameter of this model"
    return None


def continue_with_global_batch(state: dict, config: Config, world_size: int,
                               steps_per_epoch: int, warn: bool = True) -> tuple[int, int]:
    """(step in the epoch, global iteration) to continue from. A checkpoint made with another
    global batch continues with this run's: the record stream is the same, cut into this run's
    batches from the position reached. `warn`: say so (the first process does)."""
    saved_world, saved_batch = state["world_size"], state["global_batch_size"]
    if saved_world != world_size and warn:
        log.warning("Checkpoint made with %d processes, resuming on %d: each process now takes "
                    "%d of every global batch of %d", saved_world, world_size,
                    config.device_batch_size, config.global_batch_size)
    if saved_batch == config.global_batch_size:
        return state["step"], state["iteration"]
    position = state["step"] * saved_batch
    step = position // config.global_batch_size
    iteration = state["epoch"] * steps_per_epoch + step
    reread = position % config.global_batch_size
    if warn:
        log.warning("Global batch changes from %d to %d: the record order follows the new "
                    "batch from epoch %d step %d (iteration %d)%s", saved_batch,
                    config.global_batch_size, state["epoch"] + 1, step, iteration,
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


def lineage_of(state: dict, checkpoint_dir: str) -> str:
    """The lineage a run resumed from `state` continues. A checkpoint written before lineages
    existed continues the unmarked checkpoints of its own directory when resumed there (the same
    old run, in place); resumed into another directory, its unmarked files there are another
    run's, so it takes a lineage of its own, derived from its path (every process derives the
    same)."""
    if "lineage" in state:
        return state["lineage"]
    own_directory = os.path.dirname(os.path.abspath(state["path"]))
    if os.path.exists(checkpoint_dir) and os.path.samefile(own_directory, checkpoint_dir):
        return UNMARKED_LINEAGE
    return uuid.uuid5(uuid.NAMESPACE_URL, os.path.realpath(state["path"])).hex


def read_lineage(path: str) -> Optional[str]:
    """The lineage of the checkpoint at `path`, or None when it is no readable checkpoint. Cheap:
    with mmap the tensors are mapped, not read."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # whatever is wrong with the file, it is no checkpoint we can attribute
        return None
    if not isinstance(state, dict) or REQUIRED_KEYS - state.keys():
        return None
    lineage = state.get("lineage", UNMARKED_LINEAGE)
    return lineage if isinstance(lineage, str) else None


def checkpoints_of_other_runs(directory: str, name: str, lineage: Optional[str]) -> list[Saved]:
    """This name's complete checkpoints in `directory` not of `lineage`; all of them for a fresh
    run (lineage None). For a resumed run a file that cannot be read is not counted: it may be
    the damaged newest one the resume skipped, and no run can continue from it."""
    return [saved for saved in saved_checkpoints(directory, name)
            if lineage is None or read_lineage(saved.path) not in (lineage, None)]


def remove_older(directory: str, name: str, keep: int, lineage: str, written: str) -> None:
    """Keep `keep` checkpoints of this run's lineage, `written` (just in place) counted as the
    newest, and delete the rest of that lineage. Another run's checkpoints, and files that
    cannot be read, are never deleted. A deletion that fails is warned of: the run has its
    checkpoint."""
    ours = [saved.path for saved in saved_checkpoints(directory, name)
            if os.path.basename(saved.path) != os.path.basename(written)
            and read_lineage(saved.path) == lineage]
    for path in ours[:max(0, len(ours) - (keep - 1))]:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as error:
            log.warning("Could not delete the older checkpoint %s (%s): delete it yourself",
                        path, error.strerror)


class CheckpointLock:
    """This run's hold on its checkpoint names: an open descriptor with a flock, released by
    release() or, for a crashed run, by the kernel when the process dies. Forked input processes
    close their copy, so that ones outliving a killed run do not keep its lock."""

    def __init__(self, descriptor: int):
        self.descriptor: Optional[int] = descriptor
        os.register_at_fork(after_in_child=self.release)

    def release(self) -> None:
        if self.descriptor is not None:
            os.close(self.descriptor)
            self.descriptor = None


def lock_checkpoints(directory: str, name: str) -> CheckpointLock:
    """Lock this name's checkpoints in `directory` for this run. The file itself is never deleted
    (that would race with a run opening it)."""
    path = os.path.join(directory, f".{name}.lock")
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)  # read-only: no write-open file
    except OSError as error:
        raise UserError(f"cannot create the lock file {path} ({error.strerror}): choose a "
                        "writable --checkpoint_dir") from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(descriptor)
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise UserError(f"another run is writing checkpoints {name}_*{SUFFIX} in {directory} "
                            f"(it holds {path}): wait for it to end, or give this run another "
                            "--checkpoint_dir or --save_model_name") from None
        raise UserError(f"cannot lock {path} ({error.strerror}): choose a --checkpoint_dir on a "
                        "file system with file locks") from None
    return CheckpointLock(descriptor)


def remove_temporary_files(directory: str, name: str) -> None:
    """The temporary files that writers of this name, killed mid-write, left behind. Only for the
    holder of lock_checkpoints: no live run of this name can be writing them. The pattern is
    exact, so a name that merely starts with this one (`{name}_x`) keeps its files."""
    pattern = re.compile(re.escape(TEMPORARY_PREFIX + name) + r"_\d+(?:_step\d+)?"
                         + re.escape(SUFFIX) + _TEMPORARY_RANDOM)
    for entry in os.listdir(directory):
        if pattern.fullmatch(entry):
            _remove_if_possible(os.path.join(directory, entry))


def temporary_name(name: str, epoch: int, step: int, random_part: str) -> str:
    """The name save_checkpoint's temporary file for checkpoint (epoch, step) gets, with mkstemp's
    8 random characters given."""
    return (f"{TEMPORARY_PREFIX}{os.path.basename(checkpoint_path('', name, epoch, step))}-"
            f"{random_part}{SUFFIX}")


def _remove_if_possible(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:  # gone already, or the directory turned read-only: nothing more to do
        pass


def describe_error(error: Exception) -> str:
    """The error's type and first sentence: torch's messages go on with advice for developers."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0].split('. ')[0][:160]}" if lines else type(error).__name__


def _fsync_directory(directory: str) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
