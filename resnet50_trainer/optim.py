"""SGD as the original: Nesterov momentum 0.9, weight decay off the biases, a step LR policy.

Ours on top: the LR is scaled linearly by global batch / 256, as the original's docs said, and an
optional linear warm-up (Goyal et al. 2017).
"""

from __future__ import annotations

import torch

from resnet50_trainer.config import LR_STEP_EPOCHS, LR_STEP_FACTOR, Config
from resnet50_trainer.model import weight_decay_groups

MOMENTUM = 0.9


def build_optimizer(model: torch.nn.Module, config: Config) -> torch.optim.SGD:
    return torch.optim.SGD(
        weight_decay_groups(model, bn_weight_decay=not config.no_bn_weight_decay),
        lr=config.effective_learning_rate,
        momentum=MOMENTUM,
        nesterov=True,
        weight_decay=config.weight_decay,
    )


class LearningRateSchedule:
    """The LR as a function of the global iteration alone, so a resume needs only the iteration."""

    def __init__(self, peak_lr: float, iterations_per_epoch: int, warmup_epochs: float):
        self.peak_lr = peak_lr
        self.step_size = LR_STEP_EPOCHS * iterations_per_epoch
        self.warmup_iterations = round(warmup_epochs * iterations_per_epoch)

    def __call__(self, iteration: int) -> float:
        lr = self.peak_lr * LR_STEP_FACTOR ** (iteration // self.step_size)
        if iteration < self.warmup_iterations:
            lr *= (iteration + 1) / self.warmup_iterations
        return lr


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
