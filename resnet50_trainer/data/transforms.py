"""Crops and mirrors on decoded images, producing uint8 tensors; float work waits for the device
(precision.normalize).

Resizing the shorter side to `scale` and then cropping `size` is done as one resize of the crop's
box in the source image, which gives the same pixels as resize-then-crop up to resampling at the
edges and costs only the crop's pixels; a random-resized crop (torchvision's RandomResizedCrop) is
one resize of its box too. Where the crop lies is a `CropPlan`, computed from the image's size and
the sample's RNG alone, so the CPU path and the GPU decode path (data/gpu_decode.py) cut the same
crop. A `DecodePlan` adds the JPEG reduction the crop allows: the CPU path decodes a large JPEG at
1/2 to 1/8 scale where the crop keeps at least its output's pixels, and cuts the plan's box in
that smaller image (the same crop up to rounding); `resize_crop` does the cutting on either device.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from PIL import Image
from torchvision.transforms.v2 import functional

from resnet50_trainer.data.formats.images import jpeg_reduction

try:
    from resnet50_trainer.data._resample import SIMD, resize_box
except ImportError:  # setup.py builds it where a C compiler is
    SIMD, resize_box = False, None

# Our resampler runs (RGB only); else PyTorch's operator resizes, a little slower (docs/speed.md).
RESAMPLER = bool(SIMD)

# torchvision's RandomResizedCrop: boxes drawn this many times before the centre fallback.
RANDOM_RESIZED_ATTEMPTS = 10


class CropPlan(NamedTuple):
    """A crop: the box (left, top, right, bottom) in source pixels (a square once resized, for the
    scale crop), and the mirroring."""

    box: tuple[int, int, int, int]
    mirror: bool


class DecodePlan(NamedTuple):
    """Decode at 1/reduction (1, 2, 4 or 8; images.decode_jpeg_reduced) and cut `crop`, whose box
    is in that reduced image's pixels."""

    reduction: int
    crop: CropPlan


# (width, height) of the image at full size, and whether its decode may be reduced -> the plan.
PlanFor = Callable[[int, int, bool], DecodePlan]


def scale_plan(
    width: int, height: int, scale: int, size: int, rng: random.Random | None, reducible: bool
) -> DecodePlan:
    """The scale crop (random_plan; centre_plan without `rng`), planned in the pixels of the
    decode reduced as far as the shorter side stays at least `scale`."""
    reduction = jpeg_reduction(min(width, height), scale) if reducible else 1
    reduced_w, reduced_h = _reduced_size(width, height, reduction)
    if rng is None:
        return DecodePlan(reduction, centre_plan(reduced_w, reduced_h, scale, size))
    return DecodePlan(reduction, random_plan(reduced_w, reduced_h, scale, size, rng))


def random_resized_plan(
    width: int,
    height: int,
    size: int,
    area: tuple[float, float],
    ratio: tuple[float, float],
    rng: random.Random,
    reducible: bool,
) -> DecodePlan:
    """torchvision's RandomResizedCrop box (random_resized_box) in the full image, mirrored half
    the time; the decode reduced as far as the box keeps at least `size` pixels a side, and the
    box mapped into that reduced image."""
    box = random_resized_box(width, height, area, ratio, rng)
    mirror = rng.random() < 0.5
    left, top, right, bottom = box
    reduction = jpeg_reduction(min(right - left, bottom - top), size) if reducible else 1
    return DecodePlan(reduction, CropPlan(_reduced_box(box, width, height, reduction), mirror))


def random_resized_box(
    width: int,
    height: int,
    area: tuple[float, float],
    ratio: tuple[float, float],
    rng: random.Random,
) -> tuple[int, int, int, int]:
    """RandomResizedCrop.get_params with `rng`'s draws: a share of the image's area uniform in
    `area` and a width / height ratio log-uniform in `ratio`, tried 10 times for a box inside the
    image; else the centre box of the whole width or height clamped to `ratio`."""
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(RANDOM_RESIZED_ATTEMPTS):
        target_area = width * height * rng.uniform(*area)
        aspect = math.exp(rng.uniform(log_low, log_high))
        box_w = round(math.sqrt(target_area * aspect))
        box_h = round(math.sqrt(target_area / aspect))
        if 0 < box_w <= width and 0 < box_h <= height:
            top = rng.randint(0, height - box_h)  # torchvision draws the row first
            left = rng.randint(0, width - box_w)
            return left, top, left + box_w, top + box_h
    box_w, box_h = width, height
    if width / height < ratio[0]:
        box_h = round(width / ratio[0])
    elif width / height > ratio[1]:
        box_w = round(height * ratio[1])
    # A side rounded to nothing (ratios near 0.001 or 1000 on a thin image) keeps one pixel.
    box_w, box_h = max(1, box_w), max(1, box_h)
    left, top = (width - box_w) // 2, (height - box_h) // 2
    return left, top, left + box_w, top + box_h


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


def resize_into(pixels: np.ndarray, plan: CropPlan, out: np.ndarray) -> None:
    """The plan's crop of HWC uint8 `pixels` into `out` (size x size x C uint8, e.g. a batch's
    slot), mirrored as planned, with the arithmetic of resize_crop where PyTorch resizes uint8
    natively (CPUs with AVX2): written in place of a crop tensor and its copy. RGB on an AVX2 CPU:
    our resampler (data/_resample.c), reading the box where it lies and writing the crop mirrored
    or not; otherwise PyTorch's operator (whose out= overload torchvision's interpolate calls) and
    a flip. tests/unit/test_resample.py checks both against resize_crop, bit for bit."""
    left, top, right, bottom = plan.box
    height, width, channels = pixels.shape
    if RESAMPLER and channels == 3:
        source = pixels if pixels.flags.c_contiguous else np.ascontiguousarray(pixels)
        size_h, size_w = out.shape[:2]
        resize_box(
            source, width, height, left, top, right, bottom, out, size_w, size_h, plan.mirror
        )
        return
    image = chw(pixels)[:, top:bottom, left:right]
    target = chw(out)
    torch.ops.aten._upsample_bilinear2d_aa.out(
        image.unsqueeze(0), list(target.shape[1:]), False, None, None, out=target.unsqueeze(0)
    )
    if plan.mirror:
        target.copy_(target.flip(-1))


def chw(pixels: np.ndarray) -> torch.Tensor:
    """HWC pixels as a CHW tensor viewing the same memory (channels-last: the layout PyTorch's
    fast uint8 resize wants)."""
    return torch.from_numpy(pixels).permute(2, 0, 1)


def pil_to_hwc(image: Image.Image) -> np.ndarray:
    """A Pillow image's pixels, HWC uint8, a writable copy (torch refuses to wrap read-only
    memory)."""
    pixels = np.array(image)
    return pixels[:, :, None] if pixels.ndim == 2 else pixels


def _reduced_size(width: int, height: int, reduction: int) -> tuple[int, int]:
    """What libjpeg makes of the image at 1/reduction scale: each side rounded up."""
    return -(-width // reduction), -(-height // reduction)


def _reduced_box(box: tuple, width: int, height: int, reduction: int) -> tuple:
    """The box in the pixels of the image reduced by `reduction`, rounded, inside it."""
    if reduction == 1:
        return box
    reduced_w, reduced_h = _reduced_size(width, height, reduction)
    left, top, right, bottom = box
    box_w = max(1, round((right - left) / reduction))
    box_h = max(1, round((bottom - top) / reduction))
    x0 = min(round(left / reduction), reduced_w - box_w)
    y0 = min(round(top / reduction), reduced_h - box_h)
    return x0, y0, x0 + box_w, y0 + box_h


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
