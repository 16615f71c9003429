"""Every flag that takes a value, walked from the parser itself (not a hand-picked list), against
bad values: each is refused in one line with exit 2 before any work, or lies in the range the flag
states in --help and builds a Config. Redis URLs and GPU lists are checked part by part."""

from __future__ import annotations

import math

import pytest

from resnet50_trainer import cli
from resnet50_trainer.config.values import NO_TIME_LIMIT_S, Number
from resnet50_trainer.distributed import joining
from resnet50_trainer.errors import UserError

BAD_VALUES = ["nan", "inf", "-inf", "-1", "0", "1e308", "text", "", "1.5", str(10**30)]
# Every option that takes a value (store_true flags and --help take none).
FLAGS = [
    action for action in cli.build_parser()._actions if action.option_strings and action.nargs != 0
]


NUMBER_FLAGS = [action for action in FLAGS if isinstance(action.type, Number)]
CHOICE_FLAGS = [
    action for action in FLAGS if action.choices and not isinstance(action.type, Number)
]


def refusal(capsys, *argv: str) -> str:
    """The command line's one error line for argv; the train DB does not exist, so a value refused
    here was refused before any path was looked at."""
    status: int | str | None
    try:  # argparse exits; a check across flags returns the status
        status = cli.main(["--train_data", "no_such_db", "--use_cpu", "--log_dir", ".", *argv])
    except SystemExit as exit_info:
        status = exit_info.code
    error = capsys.readouterr().err
    assert status == 2, error
    lines = error.splitlines()
    assert len(lines) == 1 and lines[0].startswith("resnet50-trainer: error: "), error
    return lines[0]


def in_stated_range(number: Number, text: str, choices) -> bool:
    """The rule --help states for the flag, read from its fields: an int or a finite number
    within the bounds (or inf where it stands for no limit), and one of the choices if any."""
    try:
        value = number.kind(text)
    except ValueError:
        return False
    if value == math.inf and number.infinity is not None:
        return True
    low, high = number.minimum, number.maximum
    return (
        math.isfinite(value)
        and (low is None or value > low or (value == low and not number.above_minimum))
        and (high is None or value < high or (value == high and not number.below_maximum))
        and (choices is None or value in choices)
    )


def test_no_flag_takes_a_bare_int_or_float():
    """A number flag without a Number has no stated range: argparse's int/float let nan through."""
    assert not [action.dest for action in FLAGS if action.type in (int, float)]
    assert len(NUMBER_FLAGS) >= 25


@pytest.mark.parametrize("action", NUMBER_FLAGS, ids=lambda action: action.dest)
def test_every_default_lies_in_its_flag_s_range(action):
    assert action.default is None or in_stated_range(
        action.type, str(action.default), action.choices
    )


@pytest.mark.parametrize("value", BAD_VALUES)
@pytest.mark.parametrize("action", NUMBER_FLAGS, ids=lambda action: action.dest)
def test_every_number_flag_refuses_in_one_line_or_accepts_within_its_range(
    action, value, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    flag = action.option_strings[0]
    if not in_stated_range(action.type, value, action.choices):
        line = refusal(capsys, flag, value)
        assert f"argument {flag}:" in line and "Traceback" not in line
    else:
        args = cli.build_parser().parse_args(["--train_data", "null", "--use_cpu", flag, value])
        try:
            config = cli.config_from_args(args, gpus_present=0)
        except UserError as error:  # a value in range that another flag's default contradicts
            assert flag in str(error)
        else:
            setting = getattr(config, action.dest)
            expected = NO_TIME_LIMIT_S if value == "inf" else action.type.kind(value)
            assert setting == expected and math.isfinite(setting)
    assert list(tmp_path.iterdir()) == []  # nothing was written


@pytest.mark.parametrize("value", ["", "garbage", "LMDB", "0"])
@pytest.mark.parametrize("action", CHOICE_FLAGS, ids=lambda action: action.dest)
def test_every_choice_flag_refuses_other_words_in_one_line(
    action, value, capsys, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    line = refusal(capsys, action.option_strings[0], value)
    assert "invalid choice" in line
    assert list(tmp_path.iterdir()) == []


def test_an_effective_learning_rate_that_overflows_is_refused(capsys):
    line = refusal(
        capsys,
        "--train_data",
        "null",
        "--base_learning_rate",
        "1e308",
        "--batch_size",
        "1000000",
        "--num_shards",
        "65536",
        "--run_id",
        "r",
    )
    assert "overflows to infinity" in line and "lower --base_learning_rate" in line


@pytest.mark.parametrize(
    "url, named",
    [
        ("redis://host:abc", "port 'abc'"),
        ("redis://host:99999", "port '99999'"),
        ("redis://host:0/1", "port '0'"),
        ("redis://host:+5", "port '+5'"),
        ("redis://:s3cret@host:-1", "port '-1'"),
        ("redis://host/abc", "database 'abc'"),
        ("redis://host/1/2", "database '1/2'"),
        ("redis://host/-1", "database '-1'"),
        ("redis://:s3cret@/0", "names no host"),
        ("redis://[::1", "not a valid URL"),
        ("redis://host/0?db=x", "'?' or '#'"),
        ("http://host:6379", "not http://"),
        ("host:6379", "--redis_port"),
        ("", "empty"),
    ],
)
def test_a_bad_redis_url_is_refused_naming_the_bad_part(url, named, capsys):
    line = refusal(capsys, "--redis_host", url)
    assert line.startswith("resnet50-trainer: error: argument --redis_host:") and named in line
    assert "s3cret" not in line  # a URL's password is never shown


@pytest.mark.parametrize(
    "url",
    [
        "redis://host",
        "redis://host:6380",
        "redis://host/",
        "redis://host:6380/2",
        "rediss://:pw@host:1/0",
        "redis://[::1]:6379/3",
        "10.0.0.5",
        "::1",
    ],
)
def test_a_good_redis_address_is_kept_as_given(url):
    args = cli.build_parser().parse_args(["--train_data", "null", "--use_cpu", "--redis_host", url])
    assert cli.config_from_args(args, gpus_present=0).redis_host == url


@pytest.mark.parametrize("port", ["0", "65536", "-1", "http", "6379.0"])
def test_a_redis_port_outside_1_to_65535_is_refused(port, capsys):
    assert "use an integer from 1 to 65535" in refusal(capsys, "--redis_port", port)


@pytest.mark.parametrize(
    "gpus, named",
    [
        ("0,,1", "'0,,1'"),
        ("-1", "'-1'"),
        ("a", "'a'"),
        ("", "''"),
        ("0, 1", "'0, 1'"),
        ("0,", "'0,'"),
        ("1.0", "'1.0'"),
    ],
)
def test_a_bad_gpu_list_is_refused_in_one_line(gpus, named, capsys):
    line = refusal(capsys, "--gpus", gpus)
    assert "argument --gpus:" in line and named in line


def test_a_good_gpu_list_reaches_the_config():
    args = cli.build_parser().parse_args(["--train_data", "null", "--gpus", "3,1"])
    config = cli.config_from_args(args, gpus_present=4)
    assert config.gpus == (3, 1) and not config.gpus_shared


def test_a_gpu_listed_twice_gets_two_processes_that_all_reduce_over_gloo():
    args = cli.build_parser().parse_args(["--train_data", "null", "--gpus", "0,0"])
    config = cli.config_from_args(args, gpus_present=1)
    assert (config.gpus, config.processes_per_machine, config.gpus_shared) == ((0, 0), 2, True)
    assert joining._backend(config) == "gloo" and joining._bound_device(config) is None


def test_a_gpu_listed_twice_cannot_hold_a_model_parallel_pair():
    args = cli.build_parser().parse_args(
        ["--train_data", "null", "--gpus", "0,0", "--model_parallel"]
    )
    with pytest.raises(UserError, match="--gpus lists a GPU more than once: list each GPU once"):
        cli.config_from_args(args, gpus_present=2)
