"""MixUp and CutMix of a training batch (--mixup_alpha, --cutmix_alpha), with the semantics of
torchvision.transforms.v2's: each image is paired with the batch's previous one (a roll by 1), a
share drawn from Beta(alpha, alpha) mixes the pair (MixUp: the pixels; CutMix: a box of the
partner pasted in, the share then being the image's remaining area), and the labels become soft
targets mixed by that share. With both on, each batch takes one of the two with p = 0.5, as
torchvision's reference recipe (RandomChoice) does.

Unlike torchvision's transforms, which draw from torch's global generator, every draw (which of
the two, the share, the box) comes from a generator seeded by (seed, global iteration, rank): a
resume repeats them exactly, as it repeats the crops. The batch is mixed on its device, before
normalisation: that is affine and a mix's weights sum to 1, so mixing before or after it is the
same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

# Tells the mixing draws' seeds apart from the data order's ([seed, pass], data/order.py).
MIXING_STREAM = 0x6D6978


@dataclass(frozen=True)
class MixDraw:
    share: float  # of each image's own label in its target (torchvision's lam; CutMix: adjusted)
    box: tuple[int, int, int, int] | None  # CutMix: (x1, y1, x2, y2) taken from the partner


class Mixed(NamedTuple):
    images: torch.Tensor
    targets: torch.Tensor  # class indices (no mixing) or (N, num_labels) soft targets
    dominant_labels: torch.Tensor  # the label of the larger share: what training accuracy counts


def cutmix_draw(share: float, centre_x: int, centre_y: int, width: int, height: int) -> MixDraw:
    """torchvision's CutMix box around (centre_x, centre_y) for the drawn share, clipped to the
    image, and the share it leaves the image's own label."""
    half = 0.5 * math.sqrt(1.0 - share)
    half_width, half_height = int(half * width), int(half * height)
    x1, y1 = max(centre_x - half_width, 0), max(centre_y - half_height, 0)
    x2, y2 = min(centre_x + half_width, width), min(centre_y + half_height, height)
    return MixDraw(1.0 - (x2 - x1) * (y2 - y1) / (width * height), (x1, y1, x2, y2))


def mix_images(images: torch.Tensor, draw: MixDraw) -> torch.Tensor:
    """NCHW images (uint8 or float) mixed with their partners as `draw` says; MixUp in float32."""
    partners = images.roll(1, 0)
    if draw.box is None:
        return partners.float().mul_(1.0 - draw.share).add_(images.float().mul(draw.share))
    x1, y1, x2, y2 = draw.box
    mixed = images.clone()
    mixed[..., y1:y2, x1:x2] = partners[..., y1:y2, x1:x2]
    return mixed


def mix_targets(labels: torch.Tensor, share: float, num_labels: int) -> torch.Tensor:
    """One-hot labels mixed with their partners': torchvision's _mixup_label."""
    targets = F.one_hot(labels, num_labels).float()
    return targets.roll(1, 0).mul_(1.0 - share).add_(targets.mul(share))


class BatchMixing:
    def __init__(
        self, mixup_alpha: float, cutmix_alpha: float, num_labels: int, seed: int, rank: int
    ):
        self.mixup_alpha, self.cutmix_alpha = mixup_alpha, cutmix_alpha
        self.num_labels, self.seed, self.rank = num_labels, seed, rank

    @property
    def enabled(self) -> bool:
        return self.mixup_alpha > 0 or self.cutmix_alpha > 0

    def draw(self, iteration: int, height: int, width: int) -> MixDraw:
        """The mix of global iteration `iteration` on this rank: a function of the position."""
        rng = np.random.default_rng([self.seed, MIXING_STREAM, iteration, self.rank])
        cutmix = self.cutmix_alpha > 0 and (self.mixup_alpha == 0 or rng.random() < 0.5)
        alpha = self.cutmix_alpha if cutmix else self.mixup_alpha
        share = float(rng.beta(alpha, alpha))
        if not cutmix:
            return MixDraw(share, None)
        return cutmix_draw(
            share, int(rng.integers(width)), int(rng.integers(height)), width, height
        )

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, iteration: int) -> Mixed:
        """The batch of global iteration `iteration`, mixed; as it is when mixing is off."""
        if not self.enabled:
            return Mixed(images, labels, labels)
        draw = self.draw(iteration, images.shape[-2], images.shape[-1])
        # A tie (share 0.5) counts for the image's own label.
        dominant = labels if draw.share >= 0.5 else labels.roll(1, 0)
        targets = mix_targets(labels, draw.share, self.num_labels)
        return Mixed(mix_images(images, draw), targets, dominant)
