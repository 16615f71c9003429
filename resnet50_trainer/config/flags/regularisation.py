"""The regularisation flags (ours, the pieces of torchvision's ResNet-50 recipe): label smoothing,
MixUp and CutMix, no weight decay on batch norm, an EMA of the weights, synchronised batch norm.
Each is off by default: a run without them trains as the original did."""

from __future__ import annotations

from resnet50_trainer.config.flags.declare import FlagGroup, flag, flag_group
from resnet50_trainer.config.values import Number, Switch

SHARE = Number(float, 0, 1, below_maximum=True)
BETA_ALPHA = Number(float, 0, 1_000_000)
EMA_STEPS = Number(int, 1, 1_000_000_000)


def _mixing_help(what: str) -> str:
    """--mixup_alpha's or --cutmix_alpha's help."""
    return (
        f"{what} of each image with the batch's previous one, by a share drawn from "
        "Beta(alpha, alpha), as torchvision's; with both on, one of the two per batch (0: off)"
    )


@flag_group
class RegularisationFlags(FlagGroup):
    TITLE = "regularisation and EMA"

    label_smoothing: float = flag(type=SHARE, if_absent=0.0)
    """share of each target spread evenly over all labels (cross-entropy's label_smoothing; 0:
    off)"""
    mixup_alpha: float = flag(
        type=BETA_ALPHA, if_absent=0.0, help=_mixing_help("MixUp (pixels blended)")
    )
    cutmix_alpha: float = flag(
        type=BETA_ALPHA, if_absent=0.0, help=_mixing_help("CutMix (a box pasted)")
    )
    no_bn_weight_decay: bool = flag(action=Switch)
    """no weight decay on batch norm's scales either (biases never have it)"""
    # 0: no EMA of the weights
    ema_decay: float = flag(type=SHARE, if_absent=0.0)
    """keep an exponential moving average of the weights and batch-norm statistics, ema = decay x
    ema + (1 - decay) x weights at each update; scored after every epoch beside the model and saved
    in checkpoints (0: off)"""
    ema_steps: int = flag(type=EMA_STEPS, if_absent=1)
    """update the EMA every N global iterations (torchvision's reference: 32)"""
    ema_for_test: bool = flag(action=Switch)
    """the EMA's test accuracy is the log's test_accuracy and the summary's best; with --test_only,
    score the checkpoint's EMA"""
    sync_bn: bool = flag(action=Switch)
    """batch norm's training statistics over the global batch (SyncBatchNorm; GPU only)"""
