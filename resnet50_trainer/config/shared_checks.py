"""Checks of a pair of flags' values that the trainer (config/checks.py) and `resnet50-db bench`
share: the crop against its resize, the read window against the read order."""

from __future__ import annotations

from resnet50_trainer.data.settings import (
    AUTO_ORDER,
    QUASI_RANDOM_ORDER,
    RANDOM_ORDER,
    default_scale,
)
from resnet50_trainer.errors import UserError


def resolve_scale(image_size: int, scale: int | None) -> int:
    """--scale, or its default; the crop must fit in the resized image."""
    scale = scale or default_scale(image_size)
    check_crop_fits(image_size, scale)
    return scale


def check_crop_fits(image_size: int, scale: int) -> None:
    if image_size > scale:
        raise UserError(
            f"--image_size {image_size} is above --scale {scale}: the crop must fit "
            "in the resized image; raise --scale or lower --image_size"
        )


def check_read_window(read_order: str, read_window_mb: int | None) -> None:
    """--read_window_mb shapes quasi-random order's windows: refused with --read_order random."""
    if read_order == RANDOM_ORDER and read_window_mb is not None:
        raise UserError(
            f"--read_window_mb shapes the windows of --read_order {QUASI_RANDOM_ORDER}, and this "
            f"run reads in --read_order {RANDOM_ORDER}: leave --read_window_mb out, or read in "
            f"{QUASI_RANDOM_ORDER} (or {AUTO_ORDER})"
        )
