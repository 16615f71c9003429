"""The learning rate as a function of the global iteration alone, so a resume needs only the
iteration: a policy (--lr_policy) under an optional linear warm-up (Goyal et al. 2017).

Steps are given in epochs (--lr_steps) and become iterations here, once the run knows its
iterations per epoch. The decaying policies (cosine, poly) run from the end of the warm-up to the
end of the run; the others are multiplied by the warm-up, as the original's step policy was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from resnet50_trainer.config.settings import (
    DEFAULT_GAMMA,
    DEFAULT_LR_POLICY,
    DEFAULT_POWER,
    DEFAULT_STEP_EPOCHS,
    Config,
)

# Epochs x iterations per epoch are whole iterations but for float rounding (a solver's
# stepsize 7 over epochs of 3 iterations is 7 / 3 epochs, 7.000000000000001 iterations again).
_ROUNDING = 1e-9


@dataclass(frozen=True)
class LearningRateSchedule:
    peak_lr: float
    iterations_per_epoch: int
    warmup_epochs: float = 0.0
    policy: str = DEFAULT_LR_POLICY
    steps: tuple[float, ...] = (DEFAULT_STEP_EPOCHS,)  # epochs: step's period, multistep's marks
    gamma: float = DEFAULT_GAMMA
    power: float = DEFAULT_POWER
    min_lr: float = 0.0
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
            config.min_lr or 0.0,
            config.num_epochs,
        )

    def describe(self) -> str:
        """The policy in words, for the start line."""
        steps = ", ".join(f"{epoch:g}" for epoch in self.steps)
        words = {
            "step": f"x{self.gamma:g} every {steps} epochs",
            "multistep": f"x{self.gamma:g} at epochs {steps}",
            "cosine": f"cosine to {self.min_lr:g}",
            "poly": f"poly (power {self.power:g}) to {self.min_lr:g}",
            "exp": f"x{self.gamma:g} per epoch",
            "inv": f"inv (gamma {self.gamma:g} per epoch, power {self.power:g})",
            "fixed": "fixed",
        }[self.policy]
        if self.warmup_epochs:
            words += f", after {self.warmup_epochs:g} warm-up epochs"
        return words

    def __call__(self, iteration: int) -> float:
        lr = self._policy(iteration)
        warmup = self._iterations(self.warmup_epochs)
        if iteration < warmup:
            lr *= (iteration + 1) / warmup
        return lr

    def _iterations(self, epochs: float) -> int:
        return round(epochs * self.iterations_per_epoch)

    def _policy(self, iteration: int) -> float:
        peak, per_epoch = self.peak_lr, self.iterations_per_epoch
        if self.policy == "step":
            # floor(i / period), the period in (fractional) iterations, at least one.
            period = max(1.0, self.steps[0] * per_epoch)
            return peak * self.gamma ** math.floor(iteration / period + _ROUNDING)
        if self.policy == "multistep":  # each drop at the first iteration of its epoch mark
            passed = sum(
                iteration >= math.ceil(epoch * per_epoch - _ROUNDING) for epoch in self.steps
            )
            return peak * self.gamma**passed
        if self.policy == "exp":  # gamma per epoch, applied smoothly every iteration
            return peak * self.gamma ** (iteration / per_epoch)
        if self.policy == "inv":
            return peak * (1 + self.gamma * iteration / per_epoch) ** -self.power
        if self.policy in ("cosine", "poly"):
            return self.min_lr + (peak - self.min_lr) * self._decay(iteration)
        return peak  # fixed

    def _decay(self, iteration: int) -> float:
        """From 1 at the end of the warm-up to 0 at the end of the run."""
        start = self._iterations(self.warmup_epochs)
        span = max(1, self.epochs * self.iterations_per_epoch - start)
        done = min(1.0, max(0.0, (iteration - start) / span))
        if self.policy == "cosine":
            return 0.5 * (1 + math.cos(math.pi * done))
        return (1 - done) ** self.power
