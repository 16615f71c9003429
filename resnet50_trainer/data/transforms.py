"""Crops and mirrors on decoded images, producing uint8 arrays; float work waits for the device.

Resizing the shorter side to `scale` and then cropping `size` is done as one resize of the crop's
box in the source image (Pillow's `box=`), which gives the same pixels as resize-then-crop up to
resampling at the edges and costs only the crop's pixels.
"""

from __future__ import annotations

import random

import numpy as np
import torch
from PIL import Image

# The original normalised pixels as (x - 128) / 128.
PIXEL_CENTRE = 128.0
PIXEL_SCALE = 128.0


def random_crop(image: Image.Image, scale: int, size: int, rng: random.Random) -> np.ndarray:
    """Training: shorter side to `scale`, a random `size` square, mirrored half the time."""
    resized_w, resized_h = _resized_size(image, scale)
    left = rng.randint(0, resized_w - size)
    top = rng.randint(0, resized_h - size)
    crop = _resize_box(image, scale, size, left, top)
    if rng.random() < 0.5:
        crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(crop)


def centre_crop(image: Image.Image, scale: int, size: int) -> np.ndarray:
    """Evaluation: shorter side to `scale`, the centre `size` square."""
    resized_w, resized_h = _resized_size(image, scale)
    return np.asarray(_resize_box(image, scale, size, (resized_w - size) // 2, (resized_h - size) // 2))


def to_chw_tensor(pixels: np.ndarray) -> torch.Tensor:
    """HWC (or HW for grayscale) uint8 -> CHW uint8 tensor, still uint8."""
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    # One copy: into CHW order, and writable (Pillow's arrays are read-only views).
    return torch.from_numpy(np.array(pixels.transpose(2, 0, 1), order="C"))


def normalize(images: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """uint8 NCHW on the device -> centred floats, as the original did."""
    return images.to(dtype).sub_(PIXEL_CENTRE).div_(PIXEL_SCALE)


def _resized_size(image: Image.Image, scale: int) -> tuple[int, int]:
    width, height = image.size
    factor = scale / min(width, height)
    return max(scale, round(width * factor)), max(scale, round(height * factor))


def _resize_box(image: Image.Image, scale: int, size: int, left: int, top: int) -> Image.Image:
    factor = scale / min(image.size)
    box = (left / factor, top / factor, (left + size) / factor, (top + size) / factor)
    return image.resize((size, size), Image.Resampling.BILINEAR, box=box)
