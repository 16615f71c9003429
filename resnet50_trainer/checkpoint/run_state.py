"""Where the run stands and what it has done so far: advanced only by the epoch loop
(train/epoch_loop.py); its checkpoint entry is its own (checkpoint/schema.py validates the
whole)."""

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
    # The current epoch's order (--read_order): (run_length, window_runs); (1, 1) is random, as
    # every checkpoint without it read. A mid-epoch resume finishes the epoch in it.
    read_order: tuple[int, int] = (1, 1)

    def step_done(self) -> None:
        self.steps_into_epoch += 1
        self.iteration += 1

    def checkpoint_entry(self, epoch_sums: torch.Tensor | None, epoch_seconds: float) -> dict:
        """The run's position and totals as a checkpoint holds them; within an epoch, also the
        epoch's global sums so far and its seconds."""
        return {
            "epoch": self.epochs_done,
            "step": self.steps_into_epoch,
            "iteration": self.iteration,
            "total_images": self.total_images,
            "total_seconds": self.total_seconds,
            "epoch_sums": None if epoch_sums is None else epoch_sums.cpu(),
            "epoch_seconds": epoch_seconds,
            "read_order": dict(zip(("run_length", "window_runs"), self.read_order)),
        }

    @classmethod
    def from_checkpoint(cls, state: dict) -> RunState:
        """The run's position and totals as the checkpoint left them."""
        mid_epoch = bool(state["step"])
        read_order = state.get("read_order")  # absent before --read_order: random
        return cls(
            state["epoch"],
            state["step"],
            state["iteration"],
            state["total_seconds"],
            state["total_images"],
            state["epoch_sums"] if mid_epoch else None,
            state["epoch_seconds"] if mid_epoch else 0.0,
            (read_order["run_length"], read_order["window_runs"]) if read_order else (1, 1),
        )

    def epoch_done(self, seconds: float, images: int) -> None:
        self.epochs_done += 1
        self.steps_into_epoch = 0
        self.total_seconds += seconds
        self.total_images += images
        self.resumed_sums, self.resumed_seconds = None, 0.0
