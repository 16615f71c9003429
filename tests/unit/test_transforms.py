"""Crops on uint8 images: sizes, the box-resize shortcut, mirroring, and normalisation."""

from __future__ import annotations

import random

import numpy as np
import torch
from PIL import Image

from resnet50_trainer.data import transforms
from resnet50_trainer.model.precision import normalize


def gradient_image(width=80, height=60):
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None, None]
    pixels = np.concatenate(
        [
            np.broadcast_to(x, (height, width, 1)),
            np.broadcast_to(y, (height, width, 1)),
            np.full((height, width, 1), 77, np.float32),
        ],
        axis=2,
    )
    return Image.fromarray(pixels.astype(np.uint8))


def crop(image, plan, size):
    return transforms.resize_crop(transforms.chw(transforms.pil_to_hwc(image)), plan, size)


def test_centre_crop_matches_resize_then_crop():
    image = gradient_image()
    plan = transforms.centre_plan(80, 60, 48, 40)
    ours = crop(image, plan, 40).permute(1, 2, 0).numpy().astype(int)
    resized = image.resize((64, 48), Image.Resampling.BILINEAR)
    reference = np.asarray(resized.crop((12, 4, 52, 44))).astype(int)
    assert ours.shape == (40, 40, 3)
    assert np.abs(ours - reference).max() <= 2  # resampling at the edges differs slightly


def test_random_crops_are_deterministic_per_seed_and_mirror():
    image = gradient_image()
    plans = [transforms.random_plan(80, 60, 48, 40, random.Random(seed)) for seed in range(20)]
    crops = [crop(image, plan, 40) for plan in plans]
    assert all(c.shape == (3, 40, 40) and c.dtype == torch.uint8 for c in crops)
    assert transforms.random_plan(80, 60, 48, 40, random.Random(3)) == plans[3]
    assert len({plan.box for plan in plans}) > 1  # the position varies
    # The red channel grows left to right; a mirrored crop has it falling.
    directions = {bool(c[0, :, -1].float().mean() > c[0, :, 0].float().mean()) for c in crops}
    assert directions == {True, False}
    assert all(
        (bool(c[0, :, -1].float().mean() < c[0, :, 0].float().mean()) == plan.mirror)
        for c, plan in zip(crops, plans)
    )


def test_plans_stay_inside_the_image():
    for width, height in ((80, 60), (60, 80), (37, 37), (300, 41)):
        for seed in range(30):
            left, top, right, bottom = transforms.random_plan(
                width, height, 37, 32, random.Random(seed)
            ).box
            assert 0 <= left < right <= width and 0 <= top < bottom <= height
            assert right - left == bottom - top  # square in the source, as in the resized image


def test_grayscale_keeps_one_channel():
    gray = gradient_image().convert("L")
    assert transforms.pil_to_hwc(gray).shape == (60, 80, 1)
    assert crop(gray, transforms.centre_plan(80, 60, 40, 32), 32).shape == (1, 32, 32)


def test_normalize_matches_the_original():
    images = torch.tensor([[[[0, 128, 255]]]], dtype=torch.uint8)
    assert torch.allclose(normalize(images), torch.tensor([[[[-1.0, 0.0, 127 / 128]]]]))
