"""The command line: every flag of the original, and bad settings refused in one line with exit
2."""

from __future__ import annotations

import dataclasses
import os

import pytest

from resnet50_trainer.cli import build_parser
from resnet50_trainer.commands import run_command
from resnet50_trainer.config.settings import Config
from resnet50_trainer.errors import Diverged, PeerLost, RecordError, RunFailed, UserError
from resnet50_trainer.tools.db import command as db_command
from tests.support.dbfactory import write_db
from tests.support.original_flags import ORIGINAL_FLAGS
from tests.support.trainer_runs import config_of


def parse(argv, gpus_present=0):
    return config_of(*argv, gpus_present=gpus_present)


def test_every_original_flag_is_accepted_by_the_parser():
    option_strings = {
        option for action in build_parser()._actions for option in action.option_strings
    }
    assert set(ORIGINAL_FLAGS) <= option_strings


def test_defaults_follow_the_original(tmp_path):
    config = parse(["--train_data", "null", "--use_cpu"])
    assert (
        config.db_type,
        config.processes_per_machine,
        config.num_channels,
        config.image_size,
    ) == (
        "lmdb",
        1,
        3,
        227,
    )
    assert (config.num_labels, config.batch_size, config.num_epochs) == (1000, 32, 1000)
    assert (config.base_learning_rate, config.weight_decay, config.redis_port) == (0.1, 1e-4, 6379)
    assert config.save_model_name == "resnet50_model" and config.file_store_path == "/tmp"
    assert config.scale == round(227 / 0.875) and config.num_layers == 50


def test_derived_values():
    config = parse(
        [
            "--train_data",
            "null",
            "--use_cpu",
            "--num_gpus",
            "2",
            "--batch_size",
            "64",
            "--image_size",
            "224",
        ]
    )
    assert config.scale == 256
    assert (config.device_batch_size, config.global_batch_size, config.world_size) == (32, 64, 2)
    assert config.effective_learning_rate == pytest.approx(0.1 * 64 / 256)
    assert config.iterations_per_epoch(1000) == 15  # one pass over the DB without --epoch_size


@pytest.mark.parametrize(
    "argv, gpus, message",
    [
        (
            ["--use_cpu", "--num_gpus", "3", "--batch_size", "16"],
            0,
            "does not divide by the 3 devices",
        ),
        (["--gpus", "0,1", "--num_gpus", "3"], 4, "give one of the two"),
        (["--num_gpus", "4"], 2, "this machine has 2"),
        (["--num_gpus", "1"], 0, "add --use_cpu"),
        (["--use_cpu", "--gpus", "0"], 0, "drop one of them"),
        (["--use_cpu", "--shard_id", "1"], 0, "not below --num_shards"),
        (["--use_cpu", "--image_size", "300", "--scale", "256"], 0, "above --scale"),
        (["--model_parallel", "--num_gpus", "1"], 1, "2 GPUs, so 2 GPUs are needed"),
        (["--model_parallel", "--gpus", "0,1,2"], 4, "even number of GPUs"),
        (["--model_parallel", "--gpus", "0,1", "--num_gpus", "2"], 4, "give one of the two"),
        (["--use_cpu", "--pipeline_chunks", "2"], 0, "add --model_parallel"),
    ],
)
def test_contradictory_settings_are_refused(argv, gpus, message):
    with pytest.raises(UserError, match=message):
        parse(["--train_data", "null", *argv], gpus)


def test_model_parallel_takes_gpus_in_pairs():
    config = parse(
        ["--train_data", "null", "--model_parallel", "--num_gpus", "2", "--batch_size", "64"],
        gpus_present=4,
    )
    assert (
        config.gpus == (0, 1, 2, 3)
        and config.processes_per_machine == 2
        and config.device_batch_size == 32
    )
    listed = parse(["--train_data", "null", "--model_parallel", "--gpus", "2,3"], gpus_present=4)
    assert listed.gpus == (2, 3) and listed.processes_per_machine == 1


def test_missing_database_is_refused(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        parse(["--train_data", str(tmp_path / "nope"), "--use_cpu"])
    with pytest.raises(UserError, match="--test_data"):
        parse(["--train_data", "null", "--test_data", str(tmp_path / "nope"), "--use_cpu"])


def test_a_password_inside_a_redis_url_never_reaches_logs_or_checkpoints():
    config = parse(["--train_data", "null", "--use_cpu"])
    with_password = dataclasses.replace(
        config, redis_host="redis://:hunter2@10.0.0.5:6380/2", redis_password="hunter2"
    )
    saved = with_password.to_dict()
    assert "hunter2" not in repr(saved)
    assert saved["redis_host"] == "redis://:***@10.0.0.5:6380/2"


def test_the_saved_settings_are_named_by_their_flags():
    """The run log's first line and a checkpoint's arguments: the original's Namespace."""
    saved = parse(["--train_data", "null", "--use_cpu", "--num_gpus", "2"]).to_dict()
    flags = {action.dest for action in build_parser()._actions} - {"help", "version"}
    assert saved["num_gpus"] == 2 and "processes_per_machine" not in saved
    assert set(saved) == (flags - {"processes_per_machine"}) | {"num_gpus"}


def test_each_flag_is_the_config_field_of_its_name():
    """One definition per setting: the Config is built from the parsed flags, name for name."""
    flags = {action.dest for action in build_parser()._actions} - {"help", "version"}
    assert flags == {field.name for field in dataclasses.fields(Config)}


@pytest.mark.parametrize(
    "error, status",
    [
        (UserError("--flag 3 is wrong: give 4"), 2),
        (RecordError("record 7 is no image"), 2),
        (Diverged("training diverged: loss nan"), 1),
        (PeerLost("a peer was lost"), 1),
        (RunFailed("rank 1 stopped"), 1),
    ],
)
def test_every_command_ends_on_what_happened_in_one_line(error, status, capsys):
    def fails():
        raise error

    assert run_command("resnet50-tool", fails) == status
    assert capsys.readouterr().err == f"resnet50-tool: error: {error}\n"


def test_ctrl_c_ends_a_command_with_130_and_a_bug_keeps_its_traceback(capsys):
    def interrupted():
        raise KeyboardInterrupt

    assert run_command("resnet50-tool", interrupted) == 130
    assert capsys.readouterr().err == "resnet50-tool: interrupted\n"
    with pytest.raises(ZeroDivisionError):
        run_command("resnet50-tool", lambda: 1 // 0)
    assert run_command("resnet50-tool", lambda: None) == 0
    assert not issubclass(RecordError, UserError)  # a bad record is the data's, not the flags'


def test_a_record_that_cannot_be_decoded_ends_a_db_command_in_one_line(tmp_path, capsys):
    path = write_db(str(tmp_path / "garbage"), "lmdb", [(b"00000000", b"\x08\x01not an image")])
    assert db_command.main(["dump", path, "--index", "0", "--out", str(tmp_path / "o.png")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("resnet50-db dump: error: "), lines
    assert os.listdir(tmp_path) == ["garbage"]
