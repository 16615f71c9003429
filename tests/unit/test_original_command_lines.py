"""A command line ported from Caffe2's resnet50_trainer.py (or Caffe's): its `--use_cpu True`
boolean values, its learning rate (the base LR as given) one flag away, Caffe's `--gpus all`."""

from __future__ import annotations

import os

import pytest

from resnet50_trainer.cli import build_parser
from resnet50_trainer.config.parsing import HELP_DEFAULT, FlagHelpFormatter
from resnet50_trainer.errors import UserError
from tests.support.trainer_runs import SMALL_RUN, config_of, refused_in_process

# Every boolean flag, found from the parser: one added later as a plain store_true is tested too.
SWITCHES = [action for action in build_parser()._actions if action.const is True]
# What a switch needs beside it: --test_only evaluates a checkpoint on a test DB (any existing
# path here: a Config is made, nothing is opened).
NEEDED_WITH = {
    "test_only": ["--load_model_path", "checkpoint.pt", "--test_data", os.curdir],
    "ema_for_test": ["--ema_decay", "0.999"],
}


# SMALL_RUN's global batch is 8: the default scaling makes the base LR 0.1 into 0.1 x 8 / 256.
BASE_LR, SCALED_LR = 0.1, 0.1 * 8 / 256


def test_every_boolean_flag_is_found():
    assert {action.dest for action in SWITCHES} >= {
        "use_cpu",
        "model_parallel",
        "float16_compute",
        "enable_tensor_core",
        "compile",
    }


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, True),  # the bare switch
        ("True", True),
        ("False", False),  # off, as a ported script means (Python's bool("False") is True)
        ("1", True),
        ("0", False),
        ("yes", True),
        ("NO", False),
        ("tRuE", True),
    ],
)
@pytest.mark.parametrize("action", SWITCHES, ids=lambda action: action.dest)
def test_every_boolean_flag_is_a_switch_and_takes_the_original_s_values(action, value, expected):
    flag = action.option_strings[0]
    spaced = [flag] if value is None else [flag, value]
    joined = [f"{flag}={value or 'true'}"]  # --use_cpu=True, as some of the original's scripts
    for given in (spaced, joined, []):
        # The flag first, so that a bare switch is followed by another flag, as in most scripts.
        config = config_of(
            *given, "--train_data", "null", *NEEDED_WITH.get(action.dest, []), gpus_present=2
        )
        assert getattr(config, action.dest) is (expected if given else False)


@pytest.mark.parametrize("value", ["maybe", "", "2", "on", "True "])
@pytest.mark.parametrize("action", SWITCHES, ids=lambda action: action.dest)
def test_a_boolean_flag_s_other_values_are_refused_in_one_line(action, value, capsys):
    flag = action.option_strings[0]
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--train_data", "null", flag, value])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error, error
    assert error.startswith(f"resnet50-trainer: error: argument {flag}: invalid value {value!r}")
    assert "use true or false (or 1/0, yes/no)" in error


def test_use_cpu_false_on_a_machine_without_gpus_is_refused_as_a_gpu_run(capsys):
    with pytest.raises(UserError) as gpu_run:
        config_of("--train_data", "null")  # no --use_cpu: a GPU run
    line = refused_in_process(capsys, "--use_cpu", "False", "--train_data", "null")
    assert line == f"resnet50-trainer: error: {gpu_run.value}"


def test_the_learning_rate_scaling_is_linear_unless_none_is_asked_for():
    assert config_of(*SMALL_RUN, "--train_data", "null").effective_learning_rate == SCALED_LR
    config = config_of(*SMALL_RUN, "--train_data", "null", "--lr_scaling", "none")
    assert config.effective_learning_rate == BASE_LR


@pytest.mark.parametrize("action", build_parser()._actions, ids=lambda action: action.dest)
def test_help_shows_each_flag_s_default_once(action):
    shown = FlagHelpFormatter("resnet50-trainer")._expand_help(action) if action.help else ""
    assert shown.count("default") == shown.count(HELP_DEFAULT) <= 1, shown


@pytest.mark.parametrize(
    ("flags", "gpus", "processes"),
    [
        (["--gpus", "all"], (0, 1, 2, 3), 4),
        (["--gpus", "ALL", "--num_gpus", "4"], (0, 1, 2, 3), 4),
        (["--gpus", "all", "--model_parallel"], (0, 1, 2, 3), 2),
    ],
)
def test_gpus_all_takes_every_gpu_of_the_machine(flags, gpus, processes):
    config = config_of("--train_data", "null", "--batch_size", "64", *flags, gpus_present=4)
    assert (config.gpus, config.processes_per_machine) == (gpus, processes)
    assert config.device_batch_size == 64 // processes


@pytest.mark.parametrize(
    ("flags", "gpus_present", "message"),
    [
        (["--gpus", "all"], 0, "--gpus all: no GPU found on this machine; add --use_cpu"),
        (["--gpus", "all", "--num_gpus", "2"], 4, "--gpus lists 4 GPUs but --num_gpus says 2"),
        (["--gpus", "all", "--model_parallel"], 3, "needs an even number of GPUs (got 3: 0,1,2)"),
        (["--gpus", "all", "--use_cpu"], 0, "--gpus names GPUs but --use_cpu trains on the CPU"),
    ],
)
def test_gpus_all_that_does_not_add_up_is_refused(flags, gpus_present, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config_of("--train_data", "null", *flags, gpus_present=gpus_present)
