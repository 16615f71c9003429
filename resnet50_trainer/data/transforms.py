"""Crops and mirrors on decoded images, producing uint8 tensors; float work waits for the device
(precision.normalize).

Resizing the shorter side to `scale` and then cropping `size` is done as one resize of the crop's
box in the source image, which gives the same pixels as resize-then-crop up to resampling at the
edges and costs only the crop's pixels. Where the crop lies is a `CropPlan`, computed from the
decoded image's size and the sample's RNG alone, so the CPU path and the GPU decode path
(data/gpu_decode.py) cut the same crop of a full-size decode (the CPU path may decode a large JPEG
at 1/2 to 1/8 scale first, and then cuts the same crop up to rounding); `resize_crop` does the
cutting on either device.
"""

from __future__ import annotations

import random
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image
from torchvision.transforms.v2 import functional


class CropPlan(NamedTuple):
    """A square crop: the box (left, top, right, bottom) in source pixels, and the mirroring."""

    box: tuple[int, int, int, int]
    mirror: bool


def random_plan(width: int, height: int, scale: int, size: int, rng: random.Random) -> CropPlan:
    """Training: shorter side to `scale`, a random `size` square, mirrored half the time."""
    resized_w, resized_h = _resized_size(width, height, scale)
    left = rng.randint(0, resized_w - size)
    top = rng.randint(0, resized_h - size)
    return CropPlan(_source_box(width, height, scale, size, left, top), rng.random() < 0.5)


def centre_plan(width: int, height: int, scale: int, size: int) -> CropPlan:
    """Evaluation: shorter side to `scale`, the centre `size` square."""
    resized_w, resized_h = _resized_size(width, height, scale)
    box = _source_box(width, height, scale, size, (resized_w - size) // 2, (resized_h - size) // 2)
    return CropPlan(box, False)


def resize_crop(image: torch.Tensor, plan: CropPlan, size: int) -> torch.Tensor:
    """CHW uint8 image (any device) -> the plan's crop as a `size` x `size` CHW uint8 tensor.

    Bilinear with antialiasing, as Pillow resizes. On the CPU, torchvision resizes uint8 directly
    (several times faster than Pillow's resize); elsewhere it works in float and rounds back.
    """
    left, top, right, bottom = plan.box
    resized = functional.resized_crop(
        image, top, left, bottom - top, right - left, [size, size], antialias=True
    )
    return functional.horizontal_flip(resized) if plan.mirror else resized


def pil_to_chw(image: Image.Image) -> torch.Tensor:
    """A Pillow image as a CHW uint8 view of one copy of its pixels (channels-last in memory,
    which is the layout PyTorch's fast uint8 resize wants)."""
    pixels = np.array(image)  # a writable copy: torch refuses to wrap read-only memory
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    return torch.from_numpy(pixels).permute(2, 0, 1)


def _resized_size(width: int, height: int, scale: int) -> tuple[int, int]:
    factor = scale / min(width, height)
    return max(scale, round(width * factor)), max(scale, round(height * factor))


def _source_box(width: int, height: int, scale: int, size: int, left: int, top: int) -> tuple:
    """The crop at (left, top) of the resized image, in whole source pixels inside the image."""
    factor = scale / min(width, height)
    x0, y0 = round(left / factor), round(top / factor)
    extent = max(1, round(size / factor))
    return (
        min(x0, width - extent),
        min(y0, height - extent),
        min(x0, width - extent) + extent,
        min(y0, height - extent) + extent,
    )
