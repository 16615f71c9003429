"""--recipe: a preset of flag values beneath the command line's (a flag given there wins, and the
start says so). `caffe2`, the default, sets nothing: the original's 2015 way. `modern` sets
torchvision's ResNet-50 v2 recipe (references/classification, the weights IMAGENET1K_V2, 80.858%
top-1) where it fits a from-scratch run of ours: its LR policy, warm-up, regularisation, EMA,
crops and FixRes test size (with its training crop of 176). Left out: its TrivialAugment, random
erasing, repeated augmentation and 600 epochs (--num_epochs stays the user's)."""

from __future__ import annotations

import argparse

CAFFE2_RECIPE = "caffe2"
RECIPES = (CAFFE2_RECIPE, "modern")
# torchvision's values, as our flags take them.
MODERN = {
    "lr_policy": "cosine",
    "warmup_epochs": 5.0,
    "base_learning_rate": 0.125,  # its --lr 0.5 at a global batch of 1024, per 256
    "weight_decay": 2e-5,
    "no_bn_weight_decay": True,  # its --norm-weight-decay 0.0
    "label_smoothing": 0.1,
    "mixup_alpha": 0.2,
    "cutmix_alpha": 1.0,
    # Its --model-ema-decay 0.99998 every 32 steps, rescaled as its reference does (batch 1024,
    # 600 epochs) into a decay per update.
    "ema_decay": 0.99891,
    "ema_steps": 32,
    "crop": "random_resized",
    "image_size": 176,  # its --train-crop-size
}
# FixRes: its --val-resize-size 232 and --val-crop-size 224, for its training crop of 176 only.
# Under another --image_size the test sizes stay the run's own: the 176 -> 224 gain is ImageNet's
# at those sizes, and a net trained on small images can lose everything to a larger test size
# (measured on the sample data at 32 px: test accuracy 0.98 at 32, 0.10 at 41; BENCHMARKS.md).
FIXRES = {"test_resize": 232, "test_image_size": 224}


def with_recipe(args: argparse.Namespace, given: set[str]) -> tuple[argparse.Namespace, list[str]]:
    """A copy of the flags with --recipe's values set beneath the command line's; the lines that
    say what it set."""
    if args.recipe == CAFFE2_RECIPE:
        return args, []
    applied = argparse.Namespace(**vars(args))
    values = dict(MODERN)
    if "image_size" not in given or args.image_size == MODERN["image_size"]:
        values.update(FIXRES)
    for name, value in values.items():
        if name not in given:
            setattr(applied, name, value)
    set_here = [_flag(name, value) for name, value in values.items() if name not in given]
    kept = [f"--{name}" for name in values if name in given]
    lines = [f"--recipe {args.recipe}: {' '.join(set_here)}"]
    if kept:
        lines.append(f"--recipe {args.recipe}: the command line's {', '.join(kept)} kept")
    return applied, lines


def _flag(name: str, value: object) -> str:
    if value is True:  # a switch
        return f"--{name}"
    return f"--{name} {value:g}" if isinstance(value, float) else f"--{name} {value}"
