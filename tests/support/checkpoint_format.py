"""What a checkpoint file holds, as a plain structure: every key, the type of every value, the dtype
and shape of every tensor. tests/support/checkpoint_format.json pins it as checkpoints were written
before the package moved into folders, so a change to the on-disk format is a failing test."""

from __future__ import annotations

import json
import os

import torch

PINNED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoint_format.json")


def signature(value: object) -> object:
    """Keys and types, tensors as "Tensor dtype shape"; numbers by type, not value."""
    if isinstance(value, torch.Tensor):
        return f"Tensor {str(value.dtype).removeprefix('torch.')} {list(value.shape)}"
    if isinstance(value, dict):
        return {repr(key): signature(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [signature(item) for item in value]
    return type(value).__name__


def pinned() -> dict:
    with open(PINNED) as file:
        return json.load(file)


def write_pinned(checkpoint_path: str) -> None:
    """Pin the format of the checkpoint at `checkpoint_path` (run once, on the old code)."""
    state = torch.load(checkpoint_path, map_location="cpu", weights_only=True)
    with open(PINNED, "w") as file:
        json.dump(signature(state), file, indent=1, sort_keys=True)
        file.write("\n")
