"""--recipe: a preset of flag values beneath the command line's (a flag given there wins, and the
start says so). `caffe2`, the default, sets nothing: the original's 2015 way. `modern` sets
torchvision's ResNet-50 v2 recipe (references/classification, the weights IMAGENET1K_V2, 80.858%
top-1) where it fits a from-scratch run of ours: its LR policy, warm-up, regularisation, EMA,
crops and FixRes test size (with its training crop of 176). Left out: its TrivialAugment, random
erasing, repeated augmentation and 600 epochs (--num_epochs stays the user's).

Its warm-up and EMA are fitted to the run's length (fitted_to_run): torchvision's 5 warm-up epochs
and its EMA are sized for 600 epochs of ImageNet, and a short run would be all warm-up (refused)
with an EMA still at the weights it first copied."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

CAFFE2_RECIPE = "caffe2"
# torchvision's values, as our flags take them.
MODERN = {
    "lr_policy": "cosine",
    "base_learning_rate": 0.125,  # its --lr 0.5 at a global batch of 1024, per 256
    "weight_decay": 2e-5,
    "no_bn_weight_decay": True,  # its --norm-weight-decay 0.0
    "label_smoothing": 0.1,
    "mixup_alpha": 0.2,
    "cutmix_alpha": 1.0,
    "crop": "random_resized",
    "image_size": 176,  # its --train-crop-size
}
# FixRes: its --val-resize-size 232 and --val-crop-size 224, for its training crop of 176 only.
# Under another --image_size the test sizes stay the run's own: the 176 -> 224 gain is ImageNet's
# at those sizes, and a net trained on small images can lose everything to a larger test size
# (measured on the sample data at 32 px: test accuracy 0.98 at 32, 0.10 at 41; docs/speed.md,
# "Recipes on the sample data").
FIXRES = {"test_resize": 232, "test_image_size": 224}
# What modern fits to the run (fitted_to_run), from torchvision's values: --lr-warmup-epochs 5,
# --model-ema-decay 0.99998 with --model-ema-steps 32, over ImageNet's training set.
FITTED = ("warmup_epochs", "ema_decay", "ema_steps")
TORCHVISION_WARMUP_EPOCHS = 5.0
TORCHVISION_EMA_ALPHA = 1 - 0.99998
TORCHVISION_EMA_STEPS = 32
IMAGENET_TRAIN_IMAGES = 1_281_167
# A run's warm-up: a tenth of it, at most torchvision's 5 epochs.
WARMUP_SHARE = 0.1
# Updates of the EMA over a run that has the iterations for them: fewer than about a thousand
# and its average is a handful of snapshots (torchvision's 600 epochs make 23,000).
EMA_UPDATES_WANTED = 1024
# Its EMA's share of a tiny run: at least the average of the last two updates (a decay of 0 would
# turn it off).
EMA_ALPHA_BOUNDS = (1e-6, 0.5)


@dataclass(frozen=True)
class Recipe:
    """A preset: the flag values it sets beneath the command line's; the test sizes it adds where
    the run keeps its training crop (FixRes's); whether it fits its warm-up and EMA to the run."""

    values: Mapping[str, object] = field(default_factory=dict)
    test_sizes: Mapping[str, object] = field(default_factory=dict)
    fitted: bool = False


RECIPES = {CAFFE2_RECIPE: Recipe(), "modern": Recipe(MODERN, FIXRES, fitted=True)}


def with_recipe(args: argparse.Namespace, given: set[str]) -> tuple[argparse.Namespace, list[str]]:
    """A copy of the flags with --recipe's values set beneath the command line's; the lines that
    say what it set."""
    recipe = RECIPES[args.recipe]
    if not recipe.values:
        return args, []
    applied = argparse.Namespace(**vars(args))
    values = dict(recipe.values)
    if "image_size" not in given or args.image_size == recipe.values.get("image_size"):
        values.update(recipe.test_sizes)
    for name, value in values.items():
        if name not in given:
            setattr(applied, name, value)
    set_here = [_flag(name, value) for name, value in values.items() if name not in given]
    kept = [f"--{name}" for name in values if name in given]
    lines = [f"--recipe {args.recipe}: {' '.join(set_here)}"]
    if kept:
        lines.append(f"--recipe {args.recipe}: the command line's {', '.join(kept)} kept")
    return applied, lines


def with_fitted(
    args: argparse.Namespace,
    given: set[str],
    global_batch: int,
    images_per_epoch: Callable[[], int],
) -> tuple[argparse.Namespace, list[str]]:
    """A copy of the flags with --recipe modern's warm-up and EMA fitted to the run (after the
    solver file has set its epochs and batch); the line that says what was chosen.
    `images_per_epoch`: called only when something is left to fit (it may read the DB)."""
    if not RECIPES[args.recipe].fitted or given.issuperset(FITTED):
        return args, []
    images = images_per_epoch()
    kept = {name: getattr(args, name) for name in FITTED if name in given}
    values = fitted_to_run(args.num_epochs, images, global_batch, kept)
    applied = argparse.Namespace(**vars(args))
    for name, value in values.items():
        setattr(applied, name, value)
    chosen = " ".join(_flag(name, values[name]) for name in FITTED if name not in given)
    return applied, [
        f"--recipe {args.recipe}: {chosen}, fitted to {args.num_epochs} epochs of {images} "
        f"images at a global batch of {global_batch}"
    ]


def fitted_to_run(
    num_epochs: int, images_per_epoch: int, global_batch: int, given: dict[str, float]
) -> dict[str, float]:
    """The warm-up and EMA settings of --recipe modern for a run of `num_epochs` of
    `images_per_epoch` at `global_batch`; a setting in `given` (the command line's or the solver
    file's) is kept and the others fitted around it.

    Warm-up: a tenth of the run, at most torchvision's 5 epochs. EMA: torchvision's adjustment of
    its decay (adjust = world_size x batch x ema_steps / epochs; alpha = min(1, (1 - decay) x
    adjust)) with the epoch its decay was tuned on, ImageNet's, replaced by this run's: the average
    then spans the same share of the run as torchvision's does of its 600 ImageNet epochs (about a
    25th), and updates every 32 iterations only where the run has the iterations for
    EMA_UPDATES_WANTED updates."""
    iterations = num_epochs * max(1, images_per_epoch // global_batch)
    low, high = EMA_ALPHA_BOUNDS
    steps = int(
        given.get(
            "ema_steps",
            max(1, min(TORCHVISION_EMA_STEPS, iterations // EMA_UPDATES_WANTED)),
        )
    )
    adjust = global_batch * steps / num_epochs * IMAGENET_TRAIN_IMAGES / images_per_epoch
    fitted = {
        "warmup_epochs": min(TORCHVISION_WARMUP_EPOCHS, round(WARMUP_SHARE * num_epochs, 3)),
        "ema_decay": round(1 - min(high, max(low, TORCHVISION_EMA_ALPHA * adjust)), 6),
        "ema_steps": steps,
    }
    return {**fitted, **given}


def _flag(name: str, value: object) -> str:
    if value is True:  # a switch
        return f"--{name}"
    return f"--{name} {value:.6g}" if isinstance(value, float) else f"--{name} {value}"
