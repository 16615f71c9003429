"""SGD as the original: Nesterov momentum 0.9, weight decay off the biases (or, as Caffe's solver
type "SGD", plain momentum: --optimizer sgd). The LR it steps with: lr_schedule.py."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from resnet50_trainer.config.flags.optimisation import NESTEROV
from resnet50_trainer.config.settings import Config
from resnet50_trainer.model.resnet import weight_decay_groups


@dataclass(frozen=True)
class OptimizerSettings:
    learning_rate: float  # the effective LR: the schedule sets each step's
    momentum: float
    nesterov: bool
    weight_decay: float
    bn_weight_decay: bool  # also on BN scales (not with --no_bn_weight_decay)

    @classmethod
    def of(cls, config: Config) -> OptimizerSettings:
        return cls(
            config.effective_learning_rate,
            config.momentum,
            config.optimizer == NESTEROV,
            config.weight_decay,
            not config.no_bn_weight_decay,
        )


def build_optimizer(model: torch.nn.Module, settings: OptimizerSettings) -> torch.optim.SGD:
    optimizer = torch.optim.SGD(
        weight_decay_groups(model, bn_weight_decay=settings.bn_weight_decay),
        lr=settings.learning_rate,
        momentum=settings.momentum,
        nesterov=settings.nesterov,
        weight_decay=settings.weight_decay,
        fused=_fused(model),
    )
    # A checkpoint's param groups carry the kernel choice of the run that saved it (a GPU's fused
    # one, a CPU's default): this run keeps its own, as its device decides.
    kernels = {key: optimizer.defaults[key] for key in ("fused", "foreach")}

    def keep_kernels(loaded: torch.optim.Optimizer) -> None:
        for group in loaded.param_groups:
            group.update(kernels)

    optimizer.register_load_state_dict_post_hook(keep_kernels)
    if optimizer.defaults["fused"]:
        start_momentum_at_zero(optimizer)
    return optimizer


def start_momentum_at_zero(optimizer: torch.optim.SGD) -> None:
    """Before each step, a parameter with a gradient and no momentum buffer gets a zero one.

    PyTorch's fused SGD makes its buffers at the first step with torch.empty_like and, when the
    gradient scaler skips that step (float16's first steps overflow as a rule), leaves them
    unwritten: the next step adds whatever the memory held to the weights (on an H100, weights of
    2e35 by the third step; also LibreYOLO/libreyolo#771). From zero, the first applied step is
    the same arithmetic (momentum x 0 + gradient) and a skipped one leaves them zero."""

    def zero_buffers(optimizer: torch.optim.SGD, args: tuple, kwargs: dict) -> None:
        for group in optimizer.param_groups:
            if not group["momentum"]:
                continue
            for parameter in group["params"]:
                state = optimizer.state[parameter]
                if parameter.grad is not None and "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(parameter)

    optimizer.register_step_pre_hook(zero_buffers)


def _fused(model: torch.nn.Module) -> bool | None:
    """The fused kernel on GPUs: the gradient scaler then hands it the inverse scale and the
    found-inf flag on the device, where with the per-tensor kernels its step() reads found-inf with
    .item(), a host sync every step. On the CPU, None: torch's default kernels, as before."""
    on_gpus = all(parameter.device.type == "cuda" for parameter in model.parameters())
    return True if on_gpus else None


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
