"""What the input pipeline needs of a run's settings, passed whole to the parts that build it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InputSettings:
    """How records become batches: what the trainer's flags say, or `resnet50-db bench` asks."""

    num_labels: int
    num_channels: int
    scale: int  # shorter side before cropping
    image_size: int  # crop side
    seed: int  # of the crops
    num_workers: int  # input processes (0: the training process itself)
    decode_on_gpu: bool
