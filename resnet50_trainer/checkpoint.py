"""Checkpoints: written atomically, loaded safely, named {save_model_name}_{epoch}.pt.

A checkpoint is a dict of state dicts, numbers and plain settings only, so it loads with
torch.load(weights_only=True) and never unpickles arbitrary objects. The model's keys are
torchvision's (no `module.` prefix), so the weights load into torchvision's resnet as they are.
"""

from __future__ import annotations

import glob
import os
import re
import tempfile

import torch

from resnet50_trainer.errors import UserError

SUFFIX = ".pt"


def checkpoint_path(directory: str, name: str, epoch: int) -> str:
    return os.path.join(directory, f"{name}_{epoch}{SUFFIX}")


def save_checkpoint(state: dict, path: str) -> None:
    """Temporary file, fsync, rename, fsync of the directory: a crash leaves the old file or the new."""
    directory = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(prefix=".tmp-", suffix=SUFFIX, dir=directory)
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(state, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
    _fsync_directory(directory)


def load_checkpoint(path: str) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise UserError(f"--load_model_path {path} does not exist: give a checkpoint file "
                        "written by resnet50-trainer") from None
    except Exception as error:  # torch raises several types for a file that is not a checkpoint
        raise UserError(f"--load_model_path {path} is not a readable checkpoint ({type(error).__name__}): "
                        "give a .pt file written by resnet50-trainer") from error


def saved_epochs(directory: str, name: str) -> list[int]:
    """Epochs with a complete checkpoint in `directory`, oldest first."""
    pattern = re.compile(re.escape(name) + r"_(\d+)" + re.escape(SUFFIX) + "$")
    epochs = []
    for path in glob.glob(os.path.join(glob.escape(directory), f"{glob.escape(name)}_*{SUFFIX}")):
        match = pattern.match(os.path.basename(path))
        if match:
            epochs.append(int(match.group(1)))
    return sorted(epochs)


def remove_older(directory: str, name: str, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints, only after the newest is in place."""
    for epoch in saved_epochs(directory, name)[:-keep]:
        os.unlink(checkpoint_path(directory, name, epoch))


def _fsync_directory(directory: str) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
