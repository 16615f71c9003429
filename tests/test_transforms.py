"""Crops on uint8 images: sizes, the box-resize shortcut, mirroring, and normalisation."""

from __future__ import annotations

import random

import numpy as np
import torch
from PIL import Image

from resnet50_trainer.data import transforms


def gradient_image(width=80, height=60):
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None, None]
    pixels = np.concatenate([np.broadcast_to(x, (height, width, 1)),
                             np.broadcast_to(y, (height, width, 1)),
                             np.full((height, width, 1), 77, np.float32)], axis=2)
    return Image.fromarray(pixels.astype(np.uint8))


def test_centre_crop_matches_resize_then_crop():
    image = gradient_image()
    ours = transforms.centre_crop(image, 48, 40).astype(int)
    resized = image.resize((64, 48), Image.Resampling.BILINEAR)
    reference = np.asarray(resized.crop((12, 4, 52, 44))).astype(int)
    assert ours.shape == (40, 40, 3) and ours.dtype == np.int64
    assert np.abs(ours - reference).max() <= 2  # resampling of the edge pixels differs slightly


def test_random_crop_is_deterministic_per_seed_and_mirrors():
    image = gradient_image()
    crops = [transforms.random_crop(image, 48, 40, random.Random(seed)) for seed in range(20)]
    assert all(crop.shape == (40, 40, 3) and crop.dtype == np.uint8 for crop in crops)
    again = transforms.random_crop(image, 48, 40, random.Random(3))
    assert np.array_equal(crops[3], again)
    # The red channel grows left to right; a mirrored crop has it falling.
    directions = {bool(crop[:, -1, 0].mean() > crop[:, 0, 0].mean()) for crop in crops}
    assert directions == {True, False}


def test_grayscale_and_tensor_layout():
    gray = gradient_image().convert("L")
    crop = transforms.centre_crop(gray, 40, 32)
    tensor = transforms.to_chw_tensor(crop)
    assert tensor.shape == (1, 32, 32) and tensor.dtype == torch.uint8


def test_normalize_matches_the_original():
    images = torch.tensor([[[[0, 128, 255]]]], dtype=torch.uint8)
    assert torch.allclose(transforms.normalize(images), torch.tensor([[[[-1.0, 0.0, 127 / 128]]]]))
