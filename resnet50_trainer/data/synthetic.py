"""`--train_data null`: the input pipeline replaced by one batch made on the device."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from resnet50_trainer.data.batch import Batch
from resnet50_trainer.data.settings import InputSettings


class SyntheticBatches:
    """`--train_data null`: one random batch made on the device and reused, so the input pipeline
    costs nothing and the figure is compute alone."""

    def __init__(
        self, steps_per_epoch: int, batch_size: int, settings: InputSettings, device: torch.device
    ):
        generator = torch.Generator().manual_seed(settings.seed)
        shape = (batch_size, settings.num_channels, settings.image_size, settings.image_size)
        images = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
        labels = torch.randint(0, settings.num_labels, (batch_size,), generator=generator)
        self.batch = Batch(images.to(device), labels.to(device), [])
        self.steps_per_epoch = steps_per_epoch
        self.start_step = 0

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        self.start_step = start_step

    def finish_epoch_in(self, epoch: int, run_length: int, window_runs: int) -> bool:
        return False  # one batch, no order

    epoch_order_shape = (1, 1)  # in a checkpoint: as random order's

    def __len__(self) -> int:
        return self.steps_per_epoch - self.start_step

    def __iter__(self) -> Iterator[Batch]:
        return (self.batch for _ in range(len(self)))
