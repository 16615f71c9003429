"""The learning rate as a function of the global iteration alone, so a resume needs only the
iteration: a policy (--lr_policy) under an optional linear warm-up (Goyal et al. 2017).

Steps are given in epochs (--lr_steps) and become iterations here, once the run knows its
iterations per epoch. Each policy's maths and words are its entry in config/lr_policies.py; the
decaying policies (cosine, poly) run from the end of the warm-up to the end of the run (progress);
the others are multiplied by the warm-up, as the original's step policy was.
"""

from __future__ import annotations

from dataclasses import dataclass

from resnet50_trainer.config.lr_policies import (
    BY_NAME,
    DEFAULT_GAMMA,
    DEFAULT_LR_POLICY,
    DEFAULT_MIN_LR,
    DEFAULT_POWER,
    DEFAULT_STEP_EPOCHS,
)
from resnet50_trainer.config.settings import Config


@dataclass(frozen=True)
class LearningRateSchedule:
    peak_lr: float
    iterations_per_epoch: int
    warmup_epochs: float = 0.0
    policy: str = DEFAULT_LR_POLICY
    steps: tuple[float, ...] = (DEFAULT_STEP_EPOCHS,)  # epochs: step's period, multistep's marks
    gamma: float = DEFAULT_GAMMA
    power: float = DEFAULT_POWER
    min_lr: float = DEFAULT_MIN_LR
    epochs: int = 1  # the run's length, where cosine and poly end

    @classmethod
    def of(cls, config: Config, iterations_per_epoch: int) -> LearningRateSchedule:
        return cls(
            config.effective_learning_rate,
            iterations_per_epoch,
            config.warmup_epochs,
            config.lr_policy,
            config.lr_steps or (DEFAULT_STEP_EPOCHS,),
            DEFAULT_GAMMA if config.lr_gamma is None else config.lr_gamma,
            DEFAULT_POWER if config.lr_power is None else config.lr_power,
            DEFAULT_MIN_LR if config.min_lr is None else config.min_lr,
            config.num_epochs,
        )

    def describe(self) -> str:
        """The policy in words, for the start line."""
        words = BY_NAME[self.policy].describe(self)
        if self.warmup_epochs:
            words += f", after {self.warmup_epochs:g} warm-up epochs"
        return words

    def __call__(self, iteration: int) -> float:
        lr = BY_NAME[self.policy].lr(self, iteration)
        warmup = self._iterations(self.warmup_epochs)
        if iteration < warmup:
            lr *= (iteration + 1) / warmup
        return lr

    def _iterations(self, epochs: float) -> int:
        return round(epochs * self.iterations_per_epoch)

    def progress(self, iteration: int) -> float:
        """From 0 at the end of the warm-up to 1 at the end of the run."""
        start = self._iterations(self.warmup_epochs)
        span = max(1, self.epochs * self.iterations_per_epoch - start)
        return min(1.0, max(0.0, (iteration - start) / span))
