"""--recipe modern fits its warm-up and EMA to the run's length: torchvision's values on its own
600 ImageNet epochs, a tenth of a short run for the warm-up and an EMA that spans the same share
of the run; the start says what was chosen, and a flag given wins."""

from __future__ import annotations

import pytest

from resnet50_trainer.cli import build_parser, with_recipe_and_solver
from resnet50_trainer.config.recipes import fitted_to_run
from tests.support.trainer_runs import config_of

IMAGENET = 1_281_167


def test_torchvisions_own_run_gets_torchvisions_values():
    """Its --model-ema-decay 0.99998 every 32 steps at a global batch of 1024 over 600 epochs
    is 0.99891 a update (its reference's own adjustment)."""
    fitted = fitted_to_run(600, IMAGENET, 1024, {})
    assert fitted == {
        "warmup_epochs": 5.0,
        "ema_decay": pytest.approx(0.99891, abs=1e-5),
        "ema_steps": 32,
    }


def test_a_short_run_gets_a_short_warm_up_and_an_ema_that_moves():
    fitted = fitted_to_run(6, 800, 32, {})  # the sample data's 25 iterations an epoch
    assert fitted["warmup_epochs"] == pytest.approx(0.6)
    assert fitted["ema_steps"] == 1  # 150 iterations: an update each
    # The average spans about a 25th of the run's 150 updates, as torchvision's of its 23,000.
    assert 1 / (1 - fitted["ema_decay"]) == pytest.approx(150 / (IMAGENET * 2e-5), rel=1e-3)


def test_the_ema_never_turns_off_nor_reaches_one():
    assert fitted_to_run(1, 8, 8, {})["ema_decay"] == 0.5  # a run of one step
    assert 0 < fitted_to_run(1_000_000, 10**12, 8, {})["ema_decay"] < 1


def test_flags_given_win_and_the_rest_fit_around_them():
    flags = ["--train_data", "null", "--epoch_size", "800", "--recipe", "modern"]
    flags += ["--num_epochs", "6", "--ema_steps", "4", "--use_cpu"]
    args, lines = with_recipe_and_solver(build_parser().parse_args(flags), flags, None)
    assert (args.warmup_epochs, args.ema_steps) == (0.6, 4)
    assert args.ema_decay == fitted_to_run(6, 800, 32, {"ema_steps": 4})["ema_decay"]
    assert lines[-1] == (
        f"--recipe modern: --warmup_epochs 0.6 --ema_decay {args.ema_decay:.6g}, fitted to 6 "
        "epochs of 800 images at a global batch of 32"
    )
    given = flags + ["--warmup_epochs", "0", "--ema_decay", "0"]
    args, lines = with_recipe_and_solver(build_parser().parse_args(given), given, None)
    assert (args.warmup_epochs, args.ema_decay) == (0, 0) and "fitted" not in lines[-1]


def test_the_epoch_is_the_training_dbs_records(image_db):
    train = image_db("train", 48, 4)
    config = config_of(
        "--use_cpu",
        "--train_data",
        train,
        "--recipe",
        "modern",
        "--num_epochs",
        "2",
        "--batch_size",
        "8",
    )
    assert config.warmup_epochs == pytest.approx(0.2)
    assert config.ema_decay == fitted_to_run(2, 48, 8, {})["ema_decay"]
