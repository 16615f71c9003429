"""The compiled resampler (data/_resample.c) against PyTorch's uint8 antialiased bilinear resize,
bit for bit: its vector kernels, its portable path, and transforms.resize_into without it."""

from __future__ import annotations

import platform
import random

import numpy as np
import pytest
import torch

from resnet50_trainer.data import _resample, transforms


def torch_crop(pixels: np.ndarray, box: tuple, size: tuple, mirror: bool) -> np.ndarray:
    """What resize_crop makes of the box, as HWC."""
    left, top, right, bottom = box
    image = torch.from_numpy(pixels).permute(2, 0, 1)[None, :, top:bottom, left:right]
    crop = torch.ops.aten._upsample_bilinear2d_aa(image, list(size), False)[0]
    return (crop.flip(-1) if mirror else crop).permute(1, 2, 0).numpy()


def resampled(pixels, box, size, mirror, simd=True) -> np.ndarray:
    height, width, channels = pixels.shape
    out = np.empty((size[0], size[1], channels), np.uint8)
    _resample.resize_box(pixels, width, height, channels, *box, out, size[1], size[0], mirror, simd)
    return out


def noise(height: int, width: int, channels: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, channels), np.uint8)


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the vector kernels are x86-64's (AVX2)")
def test_the_resampler_is_built_with_its_vector_kernels():
    assert _resample.SIMD == (torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"))


@pytest.mark.parametrize("simd", [True, False], ids=["vector", "portable"])
def test_random_boxes_match_pytorch_bit_for_bit(simd):
    """Up- and downsampling by any factor (each horizontal kernel: groups of 4 or 2 pixels in 16 or
    32 bytes, one pixel at a time), gray and colour, mirrored or not, boxes anywhere (those
    reaching the image's last rows take the portable path for their loads)."""
    rng = random.Random(23)
    for case in range(250):
        channels = rng.choice([1, 3, 3, 3])
        height, width = rng.randint(1, 260), rng.randint(1, 260)
        pixels = noise(height, width, channels, case)
        left, top = rng.randrange(width), rng.randrange(height)
        box = (left, top, rng.randint(left + 1, width), rng.randint(top + 1, height))
        side = rng.choice([224, 32, 64, rng.randint(1, 300)])
        size = (rng.choice([side, rng.randint(1, 300)]), side)
        mirror = rng.random() < 0.5
        expected = torch_crop(pixels, box, size, mirror)
        assert np.array_equal(resampled(pixels, box, size, mirror, simd), expected), (
            case,
            pixels.shape,
            box,
            size,
            mirror,
        )


@pytest.mark.parametrize(
    "shape, box, size",
    [
        ((1, 1, 3), (0, 0, 1, 1), (224, 224)),  # one pixel to a whole crop
        ((300, 300, 3), (0, 0, 300, 300), (1, 1)),  # a whole image to one pixel
        ((8, 2000, 3), (0, 0, 2000, 8), (8, 32)),  # 62x down: one pixel at a time, 125 taps
        ((40, 40, 3), (0, 0, 40, 40), (40, 40)),  # the same size: identity weights, exact copy
        ((224, 300, 3), (0, 0, 300, 224), (224, 224)),  # as tall as the output: no vertical pass
        ((50, 17, 3), (0, 49, 17, 50), (5, 9)),  # the buffer's last row alone
    ],
)
def test_extreme_shapes_match_pytorch(shape, box, size):
    pixels = noise(*shape, seed=sum(shape))
    for mirror in (False, True):
        expected = torch_crop(pixels, box, size, mirror)
        for simd in (True, False):
            assert np.array_equal(resampled(pixels, box, size, mirror, simd), expected)
    if box == (0, 0, 40, 40):
        assert np.array_equal(resampled(pixels, box, size, False), pixels)


def test_resize_into_without_the_compiled_resampler_gives_the_same_crop(monkeypatch):
    """transforms.resize_into's fallback (PyTorch's operator and a flip), on a box of a larger
    image that is not contiguous in memory (as a whole frame's box view)."""
    whole = noise(90, 120, 3, seed=5)
    view = whole[10:80, 7:111]
    plans = [transforms.CropPlan((3, 4, 90, 66), mirror) for mirror in (False, True)]
    compiled = [np.empty((32, 32, 3), np.uint8) for _ in plans]
    for plan, out in zip(plans, compiled):
        transforms.resize_into(view, plan, out)
    monkeypatch.setattr(transforms, "resize_box", None)
    for plan, out in zip(plans, compiled):
        fallback = np.empty((32, 32, 3), np.uint8)
        transforms.resize_into(view, plan, fallback)
        assert np.array_equal(fallback, out)
        crop = transforms.resize_crop(transforms.chw(np.ascontiguousarray(view)), plan, 32)
        assert torch.equal(transforms.chw(out), crop)


@pytest.mark.parametrize(
    "arguments, message",
    [
        ((10, 10, 3, 0, 0, 11, 10), "inside the image"),
        ((10, 10, 3, 5, 5, 5, 9), "inside the image"),
        ((10, 10, 3, -1, 0, 4, 4), "inside the image"),
        ((10, 10, 5, 0, 0, 4, 4), "channels"),
        ((11, 10, 3, 0, 0, 4, 4), "smaller than width"),
        ((0, 10, 3, 0, 0, 4, 4), "1 to 65535"),
    ],
)
def test_bad_sizes_are_refused(arguments, message):
    pixels = noise(10, 10, 3, seed=1)
    out = np.empty((8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match=message):
        _resample.resize_box(pixels, *arguments, out, 8, 8, False)
    with pytest.raises(ValueError, match="output buffer is smaller"):
        _resample.resize_box(pixels, 10, 10, 3, 0, 0, 10, 10, out, 9, 8, False)
    with pytest.raises(ValueError, match="1 to 65535"):
        _resample.resize_box(pixels, 10, 10, 3, 0, 0, 10, 10, out, 0, 8, False)
