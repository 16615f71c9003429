"""An exponential moving average of the weights and the batch-norm statistics (--ema_decay,
--ema_steps): torch's AveragedModel with get_ema_multi_avg_fn and use_buffers, as torchvision's
reference recipe keeps one. Every --ema_steps global iterations, after the optimizer's step:
ema = decay x ema + (1 - decay) x weights; the first update copies the weights. The decay is per
update, as given (torchvision's reference rescales its flag by batch, steps and epochs).

Its state is part of the checkpoint (the averaged weights under torchvision's names, and the
count of updates), so a resume continues it bitwise."""

from __future__ import annotations

import logging

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

log = logging.getLogger(__name__)


class WeightsEma:
    def __init__(self, model: torch.nn.Module, decay: float, every: int):
        """`model`: the unwrapped model, on its device(s); the average starts as its copy."""
        self.averaged = AveragedModel(
            model, multi_avg_fn=get_ema_multi_avg_fn(decay), use_buffers=True
        )
        self.every = every

    @property
    def module(self) -> torch.nn.Module:
        """The averaged model: what evaluation scores."""
        return self.averaged.module

    def update(self, model: torch.nn.Module, iteration: int) -> None:
        """After the optimizer step that completed global iteration `iteration`."""
        if iteration % self.every == 0:
            self.averaged.update_parameters(model)

    def state(self) -> dict:
        """What a checkpoint holds: the averaged weights and statistics, and the count of
        updates (0: the next update copies the weights)."""
        return {"model": self.module.state_dict(), "updates": int(self.averaged.n_averaged)}

    def load(self, state: dict) -> None:
        self.module.load_state_dict(state["model"])
        self.averaged.n_averaged.fill_(state["updates"])

    def restart_from(self, model: torch.nn.Module) -> None:
        """The average begins again at `model`'s weights (its first update copies them)."""
        self.module.load_state_dict(model.state_dict())
        self.averaged.n_averaged.fill_(0)


def build_ema(model: torch.nn.Module, decay: float, every: int) -> WeightsEma | None:
    """The run's average of `model`'s weights; None with --ema_decay 0."""
    return WeightsEma(model, decay, every) if decay > 0 else None


def restore_ema(
    ema: WeightsEma | None, saved: dict | None, model: torch.nn.Module, path: str, warn: bool
) -> None:
    """On resume: the checkpoint's average continues; a checkpoint without one (its run had no
    --ema_decay) starts it at the resumed weights. An average this run does not keep is dropped.
    `warn`: say so (the first process does)."""
    if ema is not None and saved is not None:
        ema.load(saved)
    elif ema is not None:
        ema.restart_from(model)
        if warn:
            log.info(
                "Checkpoint %s holds no EMA of the weights: the EMA starts from its weights", path
            )
    elif saved is not None and warn:
        log.warning(
            "Checkpoint %s holds an EMA of the weights, which this run (no --ema_decay) does "
            "not keep: its next checkpoints will hold none",
            path,
        )
