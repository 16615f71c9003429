"""--solver: a Caffe solver.prototxt made into flags. Its LR drops land on the iterations it names,
its iteration counts become epochs (and the start says so), the command line wins over it, and a
field it cannot honour is one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from resnet50_trainer.cli import build_parser, config_from_args, with_recipe_and_solver
from resnet50_trainer.config.launchers import Launched
from resnet50_trainer.model.lr_schedule import LearningRateSchedule
from tests.support.solver_files import STEP_SOLVER, solver_file
from tests.support.trainer_runs import (
    REPOSITORY,
    SMALL_RUN,
    config_of,
    refused_in_process,
)


def lrs(config, iterations: int) -> list[float]:
    schedule = LearningRateSchedule.of(config, config.epoch_size // config.global_batch_size)
    return [schedule(i) for i in range(iterations)]


def test_a_step_solver_drops_the_lr_at_the_iterations_it_names(tmp_path):
    config = config_of(
        *SMALL_RUN, "--train_data", "null", "--solver", solver_file(tmp_path, STEP_SOLVER)
    )
    assert lrs(config, 12) == [0.2] * 6 + [0.1] * 6
    assert (config.epoch_size, config.num_epochs, config.lr_steps) == (32, 3, (1.5,))
    assert (config.optimizer, config.momentum, config.weight_decay) == ("sgd", 0.9, 0.0005)
    assert (config.lr_scaling, config.test_epoch_size) == ("none", 16)
    # display: 1 is overridden by SMALL_RUN's --print_every 1000: the command line wins.
    assert (config.print_every, config.checkpoint_every_iters) == (1000, 2)


@pytest.mark.parametrize(
    "policy, caffe_lr",
    [
        (
            'lr_policy: "multistep" stepvalue: 3 stepvalue: 7 gamma: 0.1',
            lambda i: 0.2 * 0.1 ** ((i >= 3) + (i >= 7)),
        ),
        ('lr_policy: "poly" power: 2', lambda i: 0.2 * (1 - i / 12) ** 2),
        ('lr_policy: "exp" gamma: 0.9', lambda i: 0.2 * 0.9**i),
        ('lr_policy: "inv" gamma: 0.5 power: 0.75', lambda i: 0.2 * (1 + 0.5 * i) ** -0.75),
        ('lr_policy: "fixed"', lambda i: 0.2),
    ],
)
def test_each_caffe_policy_gives_caffes_lr_at_every_iteration(tmp_path, policy, caffe_lr):
    """solver.cpp's GetLearningRate, iteration by iteration, through the epochs it became."""
    text = f"base_lr: 0.2 max_iter: 12 test_interval: 4 {policy}"
    config = config_of(*SMALL_RUN, "--train_data", "null", "--solver", solver_file(tmp_path, text))
    assert lrs(config, 12) == pytest.approx([caffe_lr(i) for i in range(12)], rel=1e-6)


def test_the_command_line_wins_over_the_solver(tmp_path):
    path = solver_file(tmp_path, STEP_SOLVER)
    config = config_of(
        *SMALL_RUN,
        "--train_data",
        "null",
        "--solver",
        path,
        "--base_learning_rate",
        "0.05",
        "--num_epochs",
        "5",
        "--optimizer",
        "nesterov",
    )
    assert (config.base_learning_rate, config.num_epochs, config.optimizer) == (0.05, 5, "nesterov")
    flags = [*SMALL_RUN, "--train_data", "null", "--solver", path, "--num_epochs", "5"]
    _, lines = with_recipe_and_solver(build_parser().parse_args(flags), flags, None)
    assert any(
        line.endswith(
            "max_iter -> --num_epochs 3, not used: the command line's --num_epochs 5 wins"
        )
        for line in lines
    ), lines
    assert config.lr_steps == (1.5,)  # still the file's


@pytest.mark.parametrize(
    "text, words",
    [
        ("base_lr: 0.1 max_iter: 4 foo: 1", 'has no field named "foo"'),
        ('base_lr: 0.1 max_iter: 4 lr_policy: "sigmoid"', "lr_policy 'sigmoid' is not one"),
        (
            'base_lr: 0.1 max_iter: 4 type: "Adam"',
            "type 'Adam': this trainer runs SGD and Nesterov",
        ),
        ("base_lr: 0.1 max_iter: 4 solver_type: ADAGRAD", "solver_type 'ADAGRAD'"),
        ('net: "models/bvlc_alexnet/train_val.prototxt" max_iter: 4', "is not a ResNet"),
        ("net_param { layer { name: 'x' } } max_iter: 4", "a net or net state written inline"),
        ('regularization_type: "L1" max_iter: 4', "only L2 weight decay"),
        ("clip_gradients: 10 max_iter: 4", "gradients are not clipped here"),
        ("base_lr: nan max_iter: 4", "base_lr: invalid value 'nan'"),
        ("base_lr: -1 max_iter: 4", "base_lr: invalid value '-1.0'"),
        ("momentum: 1.5 max_iter: 4", "momentum: invalid value '1.5'"),
        ("max_iter: 10 test_interval: 4", "max_iter 10 is not a whole number of epochs of 4"),
        ("base_lr: 0.1", "has no max_iter"),
        ('lr_policy: "step" gamma: 0.1 max_iter: 4', "lr_policy step needs stepsize"),
        (
            'lr_policy: "multistep" gamma: 0.1 stepvalue: 3 stepvalue: 2 max_iter: 4',
            "increasing order",
        ),
        ("test_iter: 1 test_iter: 2 max_iter: 4", "test_iter has 2 values"),
        ('weights: "a.pt" weights: "b.pt" max_iter: 4', "weights names several files"),
        ("iter_size: 3 max_iter: 4", "--iter_size 3 splits each process's batch of 8"),
        ("max_iter: 4 snapshot: -1", "snapshot: invalid value '-1'"),
        ("base_lr: 0.1 max_iter: 4 {", "not Caffe SolverParameter text"),
        # Files Caffe itself refuses.
        ("max_iter: 4 stepsize: 2 gamma: 0.1", "sets gamma, stepsize but no lr_policy"),
        ('max_iter: 4 type: "SGD" solver_type: NESTEROV', "sets both type and the old solver_type"),
        ("max_iter: 4 net_param {}", "net_param: a net or net state written inline"),
        ("max_iter: 4 test_state {}", "test_state: a net or net state written inline"),
    ],
)
def test_what_a_solver_cannot_honour_is_one_line(capsys, tmp_path, text, words):
    line = refused_in_process(
        capsys, "--train_data", "null", "--solver", solver_file(tmp_path, text)
    )
    assert words in line, line


def test_a_solver_path_that_is_no_solver_file_is_one_line(capsys, tmp_path):
    for path, words in (
        (tmp_path / "missing.prototxt", "No such file or directory"),
        (tmp_path, "is not a solver file"),
        ("/dev/zero", "is not a solver file"),
    ):
        line = refused_in_process(capsys, "--train_data", "null", "--solver", str(path))
        assert words in line, line
    binary = tmp_path / "binary.prototxt"
    binary.write_bytes(b"\xff\xfe\x00base_lr")
    assert "cannot be read" in refused_in_process(
        capsys, "--train_data", "null", "--solver", str(binary)
    )


def test_the_manuals_solver_example_becomes_what_the_manual_says(tmp_path):
    readme = (Path(REPOSITORY) / "docs" / "from-caffe.md").read_text()
    start = readme.index("    # solver.prototxt: ResNet-50")
    block = readme[start : readme.index("\n\n", start)]
    path = solver_file(tmp_path, "\n".join(line[4:] for line in block.splitlines()))
    flags = ["--solver", path, "--gpus", "all", "--batch_size", "256", "--train_data", "null"]
    args, lines = with_recipe_and_solver(build_parser().parse_args(flags), flags, None)
    said = " ".join(lines)
    saying = readme[start : readme.index("- **Iterations stay iterations", start)]
    for words in re.findall(r"`([a-z_]+ -> [^`]+)`", saying):
        assert " ".join(words.split()) in said, (words, lines)
    config = config_from_args(args, gpus_present=8)
    assert (config.epoch_size, config.num_epochs, config.lr_steps) == (1_280_000, 90, (30, 60, 80))


@pytest.mark.parametrize(
    "policy, caffe_lr",
    [
        ('lr_policy: "step" stepsize: 7 gamma: 0.5', lambda i: 0.2 * 0.5 ** (i // 7)),
        (
            'lr_policy: "multistep" stepvalue: 5 stepvalue: 16 gamma: 0.5',
            lambda i: 0.2 * 0.5 ** ((i >= 5) + (i >= 16)),
        ),
    ],
)
def test_iteration_counts_off_the_epochs_grid_drop_at_caffes_iteration(tmp_path, policy, caffe_lr):
    """Epochs of 3 iterations: a stepsize of 7 is 7/3 epochs, a stepvalue of 5 is 5/3; the drops
    still land on Caffe's iterations, not one before or after."""
    text = f"base_lr: 0.2 max_iter: 21 test_interval: 3 {policy}"
    config = config_of(*SMALL_RUN, "--train_data", "null", "--solver", solver_file(tmp_path, text))
    assert lrs(config, 21) == [caffe_lr(i) for i in range(21)]


def test_a_policy_given_on_the_command_line_leaves_the_files_policy_fields(tmp_path):
    path = solver_file(tmp_path, STEP_SOLVER)
    flags = [*SMALL_RUN, "--train_data", "null", "--solver", path, "--lr_policy", "cosine"]
    config = config_of(*flags)
    assert (config.lr_policy, config.lr_steps, config.lr_gamma) == ("cosine", None, None)
    _, lines = with_recipe_and_solver(build_parser().parse_args(flags), flags, None)
    said = "\n".join(lines)
    assert "stepsize: not used: read by the file's lr_policy step" in said, said
    # --base_learning_rate given: a base for 256, scaled as the command line's flags say.
    flags = [*SMALL_RUN, "--train_data", "null", "--solver", path, "--base_learning_rate", "0.4"]
    assert config_of(*flags).lr_scaling == "linear"


def test_under_a_launcher_device_id_is_the_launchers(tmp_path):
    path = solver_file(tmp_path, "max_iter: 4 device_id: 3")
    flags = ["--train_data", "null", "--solver", path]
    torchrun = Launched("torchrun", 0, 1, 0, 1, None, None)
    args, lines = with_recipe_and_solver(build_parser().parse_args(flags), flags, torchrun)
    assert args.gpus is None and any("device_id: not used: torchrun" in line for line in lines)
