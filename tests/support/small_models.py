"""Small ResNets and seeded batches for tests of the model: a --model_parallel pair of CPU
"devices", 10 labels."""

from __future__ import annotations

import torch
import torchvision

from resnet50_trainer.model.resnet import build_model

CPU_PAIR = (torch.device("cpu"), torch.device("cpu"))
NUM_LABELS = 10


def seeded_batch(size: int = 4, channels: int = 3, pixels: int = 32, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(size, channels, pixels, pixels, generator=generator)
    labels = torch.randint(0, NUM_LABELS, (size,), generator=generator)
    return images, labels


def seeded_resnet18() -> torchvision.models.ResNet:
    torch.manual_seed(0)
    return build_model(18, NUM_LABELS, 3)
