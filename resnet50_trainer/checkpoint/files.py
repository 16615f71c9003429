"""Checkpoints: written atomically, loaded safely, named after the epoch (and step) they end at.

`{save_model_name}_{E}.pt` is the end of epoch E (1-based, as the original); a checkpoint taken
within an epoch by --checkpoint_every_iters is `{save_model_name}_{E}_step{S}.pt`: E epochs done
and S steps into the next. A checkpoint is a dict of state dicts, numbers and plain settings only,
so it loads with torch.load(weights_only=True) and never unpickles arbitrary objects. The model's
keys are torchvision's (no `module.` prefix), so the weights load into torchvision's resnet as
they are.

Checkpoints belong to a run: each holds its run's `lineage` (a random id; a resumed run keeps the
one it resumed), and retention deletes only checkpoints of this run's lineage. A lock
(lock.py), held by one run at a time, keeps a second run from writing (or cleaning up)
the same names.

What a checkpoint holds is defined in schema.py; this module handles the files.
"""

from __future__ import annotations

import io
import logging
import os
import re
import stat
import tempfile
from typing import Any, NamedTuple

import torch

from resnet50_trainer.checkpoint.schema import REQUIRED_KEYS, field_problem
from resnet50_trainer.errors import UserError
from resnet50_trainer.path_words import ACCESS_FIX, denied, shown

log = logging.getLogger(__name__)
SUFFIX = ".pt"
TEMPORARY_PREFIX = ".tmp-"
_NAME = re.compile(r"(?P<stem>.+)_(?P<epoch>\d+)(?:_step(?P<step>\d+))?" + re.escape(SUFFIX))
# A checkpoint's temporary file, `.tmp-{checkpoint's file name}-{mkstemp's 8 of [a-z0-9_]}.pt`:
# written by _temporary_affixes, read by this.
_TEMPORARY = re.compile(
    re.escape(TEMPORARY_PREFIX) + r"(?P<checkpoint>.+)-[a-z0-9_]{8}" + re.escape(SUFFIX)
)


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


def save_checkpoint(state: dict, path: str) -> None:
    """Temporary file, fsync, rename, fsync of the directory: a crash leaves the old file or the
    new.

    The state is serialized in memory first, so a failed write (disk full, quota, a directory gone
    or read-only) surfaces as the OSError it is, not as torch's stream-writer error; it removes the
    temporary file and raises UserError, and the checkpoints already in place are untouched.
    """
    buffer = io.BytesIO()
    torch.save(state, buffer)
    directory = os.path.dirname(os.path.abspath(path))
    temporary = None
    try:
        prefix, suffix = _temporary_affixes(os.path.basename(path))
        handle, temporary = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=directory)
        with os.fdopen(handle, "wb") as file:
            file.write(buffer.getbuffer())
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        temporary = None
        _fsync_directory(directory)
    except OSError as error:
        raise UserError(
            f"writing checkpoint {shown(path)} failed ({error.strerror or error}): make "
            "--checkpoint_dir writable, with room for a checkpoint, or choose another; "
            "the checkpoints already there are intact"
        ) from error
    finally:
        if temporary is not None:  # also on KeyboardInterrupt: the write is abandoned
            _remove_if_possible(temporary)


def load_checkpoint(path: str, name: str, warn: bool = True) -> dict:
    """The checkpoint at `path`; when `path` is a directory, the newest one of stem `name` (this
    run's --save_model_name) in it that can be resumed, warning (if `warn`) of each newer one
    skipped and why. Another name's checkpoints in the directory belong to another run."""
    if not os.path.isdir(path):
        try:
            return _read_checkpoint(path)
        except _Unusable as problem:
            raise UserError(
                f"--load_model_path {shown(path)} {problem.reason}: {problem.fix}"
            ) from None
    saved = saved_checkpoints(path, name)
    if not saved:
        raise UserError(
            f"--load_model_path {shown(path)} is a directory without checkpoints named "
            f"{name}_<epoch>{SUFFIX}: give a checkpoint file, or the --checkpoint_dir "
            "and --save_model_name of an earlier run"
        )
    skipped = []
    for candidate in reversed(saved):
        try:
            state = _read_checkpoint(candidate.path)
        except _Unusable as problem:
            skipped.append((candidate.path, problem.reason))
            continue
        for newer, reason in skipped if warn else ():
            log.warning(
                "Checkpoint %s %s: resuming from %s instead, the newest usable one in %s",
                newer,
                reason,
                candidate.path,
                path,
            )
        return state
    newest, reason = skipped[0]
    raise UserError(
        f"--load_model_path {shown(path)}: none of its {len(saved)} checkpoints can be "
        f"resumed (the newest, {newest}, {reason}): give a checkpoint written by "
        "resnet50-trainer"
    )


def read_checkpoint_file(path: str) -> dict:
    """The checkpoint file at `path`, for a command that only reads it (resnet50-export); UserError
    naming it and the fix when it is no checkpoint of ours or a damaged one."""
    try:
        return _read_checkpoint(path)
    except _Unusable as problem:
        raise UserError(f"checkpoint {shown(path)} {problem.reason}: {problem.fix}") from None


class NotRegularFileError(OSError):
    """A path that is no regular file (a FIFO, a device, a socket): never read."""


def load_weights_file(path: str, mmap: bool = False) -> Any:
    """torch.load of a regular file only, tensors only (weights_only): reading a FIFO or a
    device would block, or never end, before torch could refuse it. With `mmap` the tensors are
    mapped, not read."""
    if os.path.exists(path) and not stat.S_ISREG(os.stat(path).st_mode):
        raise NotRegularFileError(path)
    return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)


def _read_checkpoint(path: str) -> dict:
    try:
        state = load_weights_file(path)
    except NotRegularFileError:
        raise _Unusable(
            "is not a regular file", "give a checkpoint file written by resnet50-trainer"
        ) from None
    except FileNotFoundError:
        raise _Unusable(
            "does not exist", "give a checkpoint file written by resnet50-trainer"
        ) from None
    except PermissionError:
        raise _Unusable(f"cannot be read: {denied('read', path, fix=False)}", ACCESS_FIX) from None
    except Exception as error:  # torch raises several types for a file that is not a checkpoint
        raise _Unusable(
            f"is not a readable checkpoint ({describe_error(error)})",
            "give a .pt file written by resnet50-trainer",
        ) from None
    missing = REQUIRED_KEYS - state.keys() if isinstance(state, dict) else REQUIRED_KEYS
    if missing:
        raise _Unusable(
            f"lacks {', '.join(sorted(missing))}",
            "it is no resnet50-trainer checkpoint, or one too old to resume exactly; "
            "give a checkpoint written by this version",
        )
    problem = field_problem(state)
    if problem:
        raise _Unusable(
            f"has {problem}",
            "it was not written by resnet50-trainer or was altered; "
            "give a checkpoint written by resnet50-trainer",
        )
    state["path"] = path
    return state


def saved_checkpoints(directory: str, name: str | None = None) -> list[Saved]:
    """Complete checkpoints in `directory` (of stem `name`, or any), oldest first. Temporary files
    of an interrupted write are never listed."""
    saved = []
    for entry in os.listdir(directory):
        match = _NAME.fullmatch(entry)
        if match and not entry.startswith(TEMPORARY_PREFIX) and name in (None, match["stem"]):
            saved.append(
                Saved(int(match["epoch"]), int(match["step"] or 0), os.path.join(directory, entry))
            )
    return sorted(saved)


def remove_temporary_files(directory: str, name: str) -> None:
    """The temporary files that writers of this name, killed mid-write, left behind. Only for the
    holder of this name's lock (lock.py): no live run of this name can be writing them.
    The pattern is exact, so a name that merely starts with this one (`{name}_x`) keeps its
    files."""
    for entry in os.listdir(directory):
        temporary = _TEMPORARY.fullmatch(entry)
        target = temporary and _NAME.fullmatch(temporary["checkpoint"])
        if target and target["stem"] == name:
            _remove_if_possible(os.path.join(directory, entry))


def temporary_name(name: str, epoch: int, step: int, random_part: str) -> str:
    """The name save_checkpoint's temporary file for checkpoint (epoch, step) gets, with mkstemp's
    8 random characters given."""
    prefix, suffix = _temporary_affixes(os.path.basename(checkpoint_path("", name, epoch, step)))
    return f"{prefix}{random_part}{suffix}"


def _temporary_affixes(checkpoint_file: str) -> tuple[str, str]:
    """mkstemp's prefix and suffix for the temporary file of `checkpoint_file` (see _TEMPORARY)."""
    return f"{TEMPORARY_PREFIX}{checkpoint_file}-", SUFFIX


def _remove_if_possible(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:  # gone already, or the directory turned read-only: nothing more to do
        pass


def describe_error(error: Exception) -> str:
    """The error's type and first sentence: torch's messages go on with advice for developers."""
    lines = str(error).strip().splitlines()
    if not lines:
        return type(error).__name__
    return f"{type(error).__name__}: {lines[0].split('. ')[0][:160]}"


def _fsync_directory(directory: str) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
