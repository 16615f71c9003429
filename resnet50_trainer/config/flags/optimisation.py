"""The flags of how a run optimises: batch, epochs, the optimizer, a Caffe solver file, and the
learning rate's scaling, policy and warm-up. Part of the one parser (parser.py)."""

from __future__ import annotations

from resnet50_trainer.config.flags.declare import FlagGroup, flag, flag_group
from resnet50_trainer.config.lr_policies import (
    DEFAULT_GAMMA,
    DEFAULT_LR_POLICY,
    DEFAULT_MIN_LR,
    DEFAULT_POWER,
    LINEAR_LR_SCALING,
    LR_POLICIES,
    LR_SCALINGS,
    POLICIES,
    listed,
    policy_help,
    readers,
    steps_help,
)
from resnet50_trainer.config.recipes import CAFFE2_RECIPE, RECIPES
from resnet50_trainer.config.values import (
    BATCH_SIZE,
    SEED,
    Number,
    NumberList,
    NumberValues,
    path_value,
)

# --optimizer: the original's Nesterov momentum, or Caffe's plain momentum (type "SGD").
NESTEROV, PLAIN_SGD = "nesterov", "sgd"
OPTIMIZERS = (NESTEROV, PLAIN_SGD)
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
    optimizer: str = flag(if_absent=NESTEROV, choices=OPTIMIZERS)
    """nesterov: SGD with Nesterov momentum, as the original; sgd: plain momentum, Caffe's solver
    type SGD"""
    momentum: float = flag(type=Number(float, 0, 1, below_maximum=True), if_absent=0.9)
    """momentum"""
    weight_decay: float = flag(type=Number(float, 0), if_absent=1e-4)
    """L2 on conv and fc weights and BN scales, not on biases"""
    recipe: str = flag(if_absent=CAFFE2_RECIPE, choices=tuple(RECIPES))
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
        type=Number(float, 0),
        help=f"where {listed(readers('min_lr'))} end (default: {DEFAULT_MIN_LR:g})",
    )
    warmup_epochs: float = flag(type=Number(float, 0, 1_000_000), if_absent=0.0)
    """linear learning-rate warm-up over this many epochs (Goyal et al. 2017), fewer than
    --num_epochs"""
