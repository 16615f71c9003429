"""The flags of how a run optimises: batch, epochs, the optimizer, a Caffe solver file, and the
learning rate's scaling, policy and warm-up. Part of the one parser (parser.py)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from resnet50_trainer.config.flags.declare import FlagGroup, flag, flag_group
from resnet50_trainer.config.lr_policies import (
    BY_NAME,
    DEFAULT_GAMMA,
    DEFAULT_LR_POLICY,
    DEFAULT_POWER,
    LR_POLICIES,
    POLICIES,
    POLICY_FLAGS,
    listed,
    policy_help,
    readers,
    steps_help,
)
from resnet50_trainer.config.recipes import CAFFE2_RECIPE, RECIPES
from resnet50_trainer.config.values import (
    BATCH_SIZE,
    RESNET_STRIDE,
    SEED,
    Number,
    NumberList,
    NumberValues,
    path_value,
)
from resnet50_trainer.errors import UserError

if TYPE_CHECKING:
    from resnet50_trainer.config.settings import Config

# --lr_scaling: linear follows the original's docs (the base LR is "based on 256 global batch
# size"); none, the original's code (the base LR as given).
LINEAR_LR_SCALING = "linear"
LR_SCALINGS = (LINEAR_LR_SCALING, "none")
# --optimizer: the original's Nesterov momentum, or Caffe's plain momentum (type "SGD").
OPTIMIZERS = ("nesterov", "sgd")
EPOCHS = Number(float, 0, 1_000_000, above_minimum=True)


@flag_group
class OptimisationFlags(FlagGroup):
    TITLE = "optimisation"

    # total over this machine's devices, as the original
    batch_size: int = flag(type=BATCH_SIZE, if_absent=32)
    """batch size TOTAL over this machine's devices; must divide by them"""
    # passes each step's batch is split into, gradients accumulated
    iter_size: int = flag(type=Number(int, 1, 65536), if_absent=1)
    """passes each process's share of a batch is split into, gradients accumulated (Caffe's
    iter_size): the memory of batch / N, one step of the whole batch"""
    epoch_size: int | None = flag(type=Number(int, 1, 10**12))
    """images per epoch over all machines (default: one pass over the training DB; the original's
    was 1500000)"""
    num_epochs: int = flag(type=Number(int, 1, 1_000_000), if_absent=1000)
    """epochs"""
    optimizer: str = flag(if_absent="nesterov", choices=OPTIMIZERS)
    """nesterov: SGD with Nesterov momentum, as the original; sgd: plain momentum, Caffe's solver
    type SGD"""
    momentum: float = flag(type=Number(float, 0, 1, below_maximum=True), if_absent=0.9)
    """momentum"""
    weight_decay: float = flag(type=Number(float, 0), if_absent=1e-4)
    """L2 on conv and fc weights and BN scales, not on biases"""
    recipe: str = flag(if_absent=CAFFE2_RECIPE, choices=RECIPES)
    """caffe2: the original's training; modern: torchvision's ResNet-50 v2 recipe (cosine LR,
    warm-up, label smoothing, mixup, cutmix, EMA, random-resized crops, FixRes), its warm-up and EMA
    fitted to the run's epochs, batch and DB, said at start; flags given here override it"""
    solver: str | None = flag(type=path_value, metavar="FILE")
    """a Caffe solver.prototxt: its base_lr, lr_policy, max_iter, snapshot and the rest become the
    flags they mean (said at start); flags given here override it"""
    seed: int = flag(type=SEED, if_absent=0)
    """seed of the initial weights, the data order and the augmentation"""


def _gamma_help() -> str:
    """--lr_gamma's help: a factor for some policies, a gamma of their own for the others."""
    factor = [policy.name for policy in POLICIES if policy.gamma_at_most_one]
    return (
        f"the factor of {listed(factor)}; "
        f"{listed([name for name in readers('lr_gamma') if name not in factor])}'s gamma "
        f"(default: {DEFAULT_GAMMA:g} for {listed(readers('lr_gamma', needing=False))}, none "
        f"for {listed(readers('lr_gamma', needing=True))})"
    )


@flag_group
class LearningRateFlags(FlagGroup):
    TITLE = "learning rate"

    base_learning_rate: float = flag(type=Number(float, 0, above_minimum=True), if_absent=0.1)
    """learning rate for a global batch of 256, scaled linearly to the real global batch (see
    --lr_scaling), then shaped by --lr_policy"""
    lr_scaling: str = flag(if_absent=LINEAR_LR_SCALING, choices=LR_SCALINGS)
    """linear: the LR is --base_learning_rate x global batch / 256; none: --base_learning_rate as
    given, as the original's code did"""
    lr_policy: str = flag(if_absent=DEFAULT_LR_POLICY, choices=LR_POLICIES, help=policy_help())
    # epochs; None: the policy's default
    lr_steps: tuple[float, ...] | None = flag(
        metavar="EPOCHS", action=NumberValues, type=NumberList(EPOCHS, "epochs"), help=steps_help()
    )
    lr_gamma: float | None = flag(
        type=Number(float, 0, 1_000_000, above_minimum=True), help=_gamma_help()
    )
    lr_power: float | None = flag(
        type=Number(float, 0, 1000),
        help=f"the power of {listed(readers('lr_power'))} (default: {DEFAULT_POWER:g} for "
        f"{listed(readers('lr_power', needing=False))}, linear; none for "
        f"{listed(readers('lr_power', needing=True))})",
    )
    min_lr: float | None = flag(
        type=Number(float, 0), help=f"where {listed(readers('min_lr'))} end (default: 0)"
    )
    warmup_epochs: float = flag(type=Number(float, 0, 1_000_000), if_absent=0.0)
    """linear learning-rate warm-up over this many epochs (Goyal et al. 2017), fewer than
    --num_epochs"""


def _check_lr_settings(config: Config) -> None:
    """Each LR name read by the policy given, and the values that policy needs."""
    policy = BY_NAME[config.lr_policy]
    for name in POLICY_FLAGS:
        if getattr(config, name) is not None and name not in policy.reads:
            raise UserError(
                f"--{name} is not read by --lr_policy {policy.name}: only by "
                f"{', '.join(readers(name))}; leave it out or pick one of those"
            )
    for name in policy.needs:
        if getattr(config, name) is None:
            raise UserError(f"--lr_policy {policy.name} needs --{name}: give it")
    if policy.check_steps is not None and config.lr_steps is not None:
        policy.check_steps(policy.name, config.lr_steps)
    if policy.gamma_at_most_one and (config.lr_gamma or 0) > 1:
        raise UserError(
            f"--lr_gamma {config.lr_gamma:g} is above 1: --lr_policy {policy.name} would raise "
            "the LR without end; give a gamma from 0 to 1"
        )
    # One rule for every policy: the warm-up ends before the run does. Cosine and poly would have
    # nothing left to decay over; the others would never run at the LR asked for.
    if config.warmup_epochs >= config.num_epochs:
        raise UserError(
            f"--warmup_epochs {config.warmup_epochs:g} leaves nothing of the {config.num_epochs} "
            f"epochs after the warm-up, where --lr_policy {policy.name} runs from the full LR: "
            f"shorten the warm-up to below {config.num_epochs} epochs or run longer"
        )
    if (config.min_lr or 0) > config.effective_learning_rate:
        raise UserError(
            f"--min_lr {config.min_lr:g} is above the run's LR "
            f"{config.effective_learning_rate:g}: the LR decays to --min_lr; lower it"
        )


def _check_training_batches(config: Config) -> None:
    """An epoch holds a global batch at least; a pass gives BatchNorm 2 values a channel at
    least (in training it normalises over a pass's images and the last stage's positions, and
    torch refuses one value)."""
    if config.epoch_size is not None and config.epoch_size < config.global_batch_size:
        machines = f" x --num_shards {config.num_shards}" if config.num_shards > 1 else ""
        raise UserError(
            f"--epoch_size {config.epoch_size} is less than one global batch of "
            f"{config.global_batch_size} (--batch_size {config.batch_size}{machines}): raise "
            f"--epoch_size to {config.global_batch_size} or more, or lower --batch_size"
        )
    images = config.device_batch_size // config.iter_size
    side = -(-config.image_size // RESNET_STRIDE)
    if images * side * side < 2:
        raise UserError(
            f"a training pass holds 1 image (--batch_size {config.batch_size} / "
            f"{config.processes_per_machine} processes / --iter_size {config.iter_size}) and "
            f"at --image_size {config.image_size} ResNet's last stage is 1x1, so BatchNorm "
            "would normalise one value a channel, which it cannot: give a pass 2 images or more "
            "(a larger --batch_size, a smaller --iter_size) or raise --image_size above "
            f"{RESNET_STRIDE}"
        )


def _check_optimizer(config: Config) -> None:
    if config.optimizer == "nesterov" and config.momentum == 0:
        raise UserError(
            "--optimizer nesterov needs momentum and --momentum is 0: give a --momentum "
            "above 0, or --optimizer sgd for plain SGD"
        )


def check_optimisation(config: Config) -> None:
    if config.batch_size % config.processes_per_machine:
        raise UserError(
            f"--batch_size {config.batch_size} does not divide by the "
            f"{config.processes_per_machine} devices of this machine: use a multiple of "
            f"{config.processes_per_machine}"
        )
    if config.device_batch_size % config.iter_size:
        raise UserError(
            f"--iter_size {config.iter_size} splits each process's batch of "
            f"{config.device_batch_size} into passes of equal size, and it does not divide: "
            f"use an --iter_size that divides {config.device_batch_size}"
        )
    if not config.test_only:
        _check_training_batches(config)
    # Each flag is finite on its own; their product, the LR the run uses, must be too.
    if not math.isfinite(config.effective_learning_rate):
        raise UserError(
            f"--base_learning_rate {config.base_learning_rate:g} scaled to the global "
            f"batch of {config.global_batch_size} overflows to infinity: lower "
            "--base_learning_rate"
        )
    _check_lr_settings(config)
    _check_optimizer(config)
