"""--recipe: caffe2 (the default) sets nothing; modern sets torchvision's ResNet-50 v2 values
beneath the command line's, says so at start, and the manual's table (docs/recipes.md) says what
it sets."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from resnet50_trainer.cli import build_parser, with_recipe_and_solver
from resnet50_trainer.config.recipes import MODERN
from tests.support.trainer_runs import REPOSITORY, SMALL_RUN, config_of, refused_in_process

RUN = (*SMALL_RUN, "--train_data", "null")


def test_the_caffe2_recipe_is_the_default_run_exactly():
    default, caffe2 = config_of(*RUN), config_of(*RUN, "--recipe", "caffe2")
    assert dataclasses.replace(caffe2, recipe=default.recipe) == default


def test_modern_sets_torchvisions_values_and_fixres_with_its_training_size():
    config = config_of("--use_cpu", "--train_data", "null", "--recipe", "modern")
    for name, value in MODERN.items():
        assert getattr(config, name) == value, name
    assert (config.image_size, config.test_resize, config.test_image_size) == (176, 232, 224)
    small = config_of(*RUN, "--recipe", "modern")  # SMALL_RUN's --image_size 32 wins
    assert (small.image_size, small.test_sizes) == (32, (small.scale, 32))  # no FixRes
    given = config_of(*RUN, "--recipe", "modern", "--image_size", "176")  # its own size: FixRes
    assert given.test_sizes == (232, 224)


def test_a_flag_given_wins_over_the_recipe_and_the_start_says_which():
    flags = [*RUN, "--recipe", "modern", "--lr_policy", "step", "--mixup_alpha", "0"]
    args, lines = with_recipe_and_solver(build_parser().parse_args(flags), flags, None)
    config = config_of(*flags)
    assert (config.lr_policy, config.mixup_alpha, config.cutmix_alpha) == ("step", 0, 1.0)
    assert "--lr_policy" not in lines[0] and "--cutmix_alpha 1" in lines[0]
    assert (
        lines[1]
        == "--recipe modern: the command line's --lr_policy, --mixup_alpha, --image_size kept"
    )


def test_the_manuals_presets_table_is_what_modern_sets():
    readme = Path(REPOSITORY, "docs", "recipes.md").read_text()
    table = readme[readme.index("| setting | `--recipe caffe2`") :].split("\n\n")[0]
    rows = {
        match[0]: match[1]
        for match in re.findall(r"^\| `--([a-z_]+)` \| [^|]+ \| `?([^|`]+?)`? \|", table, re.M)
    }
    for name, value in MODERN.items():
        shown = "on" if value is True else f"{value:g}" if isinstance(value, float) else str(value)
        assert rows.get(name) == shown, (name, rows.get(name))


@pytest.mark.parametrize("value", ["Modern", "torchvision", ""])
def test_an_unknown_recipe_is_one_line(capsys, value):
    line = refused_in_process(capsys, "--train_data", "null", "--recipe", value)
    assert "--recipe: invalid choice" in line, line
