"""Our resampler (data/_resample.c) against PyTorch's uint8 antialiased bilinear resize, bit for
bit, and transforms.resize_into with and without it."""

from __future__ import annotations

import platform
import random

import numpy as np
import pytest
import torch

from resnet50_trainer.data import transforms

# Where PyTorch resizes uint8 natively (the resampler's arithmetic); elsewhere torchvision's
# resize works in float and rounds back.
NATIVE_UINT8 = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
needs_resampler = pytest.mark.skipif(
    not transforms.RESAMPLER, reason="the resampler runs on x86-64 CPUs with AVX2 only"
)


def torch_crop(pixels: np.ndarray, box: tuple, size: tuple, mirror: bool) -> np.ndarray:
    """What resize_crop makes of the box, as HWC."""
    left, top, right, bottom = box
    image = torch.from_numpy(pixels).permute(2, 0, 1)[None, :, top:bottom, left:right]
    crop = torch.ops.aten._upsample_bilinear2d_aa(image, list(size), False)[0]
    return (crop.flip(-1) if mirror else crop).permute(1, 2, 0).numpy()


def resampled(pixels: np.ndarray, box: tuple, size: tuple, mirror: bool) -> np.ndarray:
    height, width, _ = pixels.shape
    out = np.empty((size[0], size[1], 3), np.uint8)
    transforms.resize_box(pixels, width, height, *box, out, size[1], size[0], mirror)
    return out


def noise(height: int, width: int, channels: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, channels), np.uint8)


@pytest.mark.skipif(platform.machine() != "x86_64" or not NATIVE_UINT8, reason="needs AVX2")
def test_the_resampler_is_built_and_runs_here():
    assert transforms.RESAMPLER, (
        "resnet50_trainer/data/_resample.c is not built: run scripts/setup.sh, or "
        "`python setup.py build_ext --inplace` (needs gcc)"
    )


@needs_resampler
def test_random_boxes_match_pytorch_bit_for_bit():
    """Up- and downsampling by any factor (each horizontal kernel: groups of 4 or 2 pixels in 16 or
    32 bytes, one pixel at a time), mirrored or not, boxes anywhere (those reaching the buffer's
    last rows read zero-padded copies)."""
    rng = random.Random(23)
    for case in range(300):
        height, width = rng.randint(1, 260), rng.randint(1, 260)
        pixels = noise(height, width, 3, case)
        left, top = rng.randrange(width), rng.randrange(height)
        box = (left, top, rng.randint(left + 1, width), rng.randint(top + 1, height))
        side = rng.choice([224, 32, 64, rng.randint(1, 300)])
        size = (rng.choice([side, rng.randint(1, 300)]), side)
        mirror = rng.random() < 0.5
        expected = torch_crop(pixels, box, size, mirror)
        assert np.array_equal(resampled(pixels, box, size, mirror), expected), (
            case,
            pixels.shape,
            box,
            size,
            mirror,
        )


@needs_resampler
def test_every_input_size_to_the_usual_outputs_matches_pytorch():
    """Each axis's weights (double-precision, then int16) for inputs of 1 to 700 pixels: one row
    resized across, one column resized down, to the sizes crops take."""
    for output in (1, 7, 32, 64, 224, 256, 299):
        for length in range(1, 701):
            row = noise(1, length, 3, length)
            assert np.array_equal(
                resampled(row, (0, 0, length, 1), (1, output), length % 2 == 1),
                torch_crop(row, (0, 0, length, 1), (1, output), length % 2 == 1),
            ), (length, output)
            column = row.reshape(length, 1, 3)
            assert np.array_equal(
                resampled(column, (0, 0, 1, length), (output, 1), False),
                torch_crop(column, (0, 0, 1, length), (output, 1), False),
            ), (length, output)


@needs_resampler
@pytest.mark.parametrize(
    "shape, box, size",
    [
        ((1, 1, 3), (0, 0, 1, 1), (224, 224)),  # one pixel to a whole crop
        ((300, 300, 3), (0, 0, 300, 300), (1, 1)),  # a whole image to one pixel
        ((8, 2000, 3), (0, 0, 2000, 8), (8, 32)),  # 62x down: one pixel at a time, 125 taps
        ((2, 70000, 3), (0, 0, 70000, 2), (2, 32)),  # a panorama wider than 65535 (Pillow's path)
        ((40, 40, 3), (0, 0, 40, 40), (40, 40)),  # the same size: identity weights, exact copy
        ((224, 300, 3), (0, 0, 300, 224), (224, 224)),  # as tall as the output: no vertical pass
        ((50, 17, 3), (0, 49, 17, 50), (5, 9)),  # the buffer's last row alone
    ],
)
def test_extreme_shapes_match_pytorch(shape, box, size):
    height, width, channels = shape
    pixels = noise(height, width, channels, seed=sum(shape))
    for mirror in (False, True):
        assert np.array_equal(
            resampled(pixels, box, size, mirror), torch_crop(pixels, box, size, mirror)
        )
    if box == (0, 0, 40, 40):
        assert np.array_equal(resampled(pixels, box, size, False), pixels)


@pytest.mark.skipif(not NATIVE_UINT8, reason="torchvision resizes uint8 in float here")
@pytest.mark.parametrize("channels", [3, 1])
def test_resize_into_with_or_without_the_resampler_gives_resize_crops_pixels(channels, monkeypatch):
    """On a box of a larger image that is not contiguous in memory (as a whole frame's box
    view); gray images always take PyTorch's operator."""
    whole = noise(90, 120, channels, seed=5)
    view = whole[10:80, 7:111]
    for mirror in (False, True):
        plan = transforms.CropPlan((3, 4, 90, 66), mirror)
        crop = transforms.resize_crop(transforms.chw(np.ascontiguousarray(view)), plan, 32)
        for resampler in {transforms.RESAMPLER, False}:
            monkeypatch.setattr(transforms, "RESAMPLER", resampler)
            out = np.empty((32, 32, channels), np.uint8)
            transforms.resize_into(view, plan, out)
            assert torch.equal(transforms.chw(out), crop), (mirror, resampler)


@needs_resampler
@pytest.mark.parametrize(
    "arguments, message",
    [
        ((10, 10, 0, 0, 11, 10), "inside the image"),
        ((10, 10, 5, 5, 5, 9), "inside the image"),
        ((10, 10, -1, 0, 4, 4), "inside the image"),
        ((10, 10, 1, 0, -(2**31), 4), "inside the image"),
        ((11, 10, 0, 0, 4, 4), "smaller than width"),
        ((0, 10, 0, 0, 4, 4), "pixels a side"),
    ],
)
def test_bad_sizes_are_refused(arguments, message):
    pixels = noise(10, 10, 3, seed=1)
    out = np.empty((8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match=message):
        transforms.resize_box(pixels, *arguments, out, 8, 8, False)
    with pytest.raises(ValueError, match="output buffer is smaller"):
        transforms.resize_box(pixels, 10, 10, 0, 0, 10, 10, out, 9, 8, False)
    with pytest.raises(ValueError, match="1 to 65535"):
        transforms.resize_box(pixels, 10, 10, 0, 0, 10, 10, out, 0, 8, False)
