"""Where the run stands and what it has done so far: advanced only by the epoch loop
(train/epoch_loop.py), serialised only by the checkpoint schema (checkpoint/schema.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RunState:
    epochs_done: int = 0
    steps_into_epoch: int = 0  # steps done of the epoch after `epochs_done` (0 at an epoch's start)
    iteration: int = 0  # global steps completed
    # The run's totals so far, so the log's cumulative columns continue across a resume.
    total_seconds: float = 0.0
    total_images: int = 0
    # What a mid-epoch checkpoint had counted of the epoch it was taken in (global sums: loss x
    # images, correct, images, bad records; and seconds); None and 0 once that epoch has ended.
    resumed_sums: torch.Tensor | None = None
    resumed_seconds: float = 0.0

    def step_done(self) -> None:
        self.steps_into_epoch += 1
        self.iteration += 1

    def epoch_done(self, seconds: float, images: int) -> None:
        self.epochs_done += 1
        self.steps_into_epoch = 0
        self.total_seconds += seconds
        self.total_images += images
        self.resumed_sums, self.resumed_seconds = None, 0.0
