"""Each flag is declared once, as a field of its group's dataclass (config/flags/declare.py), its
help the field's docstring: the parser's flags, Config's fields and resnet50-db bench's shared
flags all come from it."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import py_compile

import pytest

from resnet50_trainer.config.flags.data import READ_ORDER_FLAGS
from resnet50_trainer.config.flags.declare import (
    FlagGroup,
    add_flag_group,
    flag,
    flag_group,
    flag_names,
)
from resnet50_trainer.config.flags.parser import build_parser, flag_actions
from resnet50_trainer.config.parsing import OneLineParser
from resnet50_trainer.config.settings import Config
from resnet50_trainer.config.values import Number
from resnet50_trainer.tools.db import bench

WIDTH = Number(int, 1, 8)


@flag_group
class ExampleFlags(FlagGroup):
    TITLE = "example"

    width: int = flag(type=WIDTH, if_absent=4)
    """how wide, in
    a docstring of two lines"""
    processes: int | None = flag(name="num_workers", metavar="N", type=int, help="how " + "many")
    password: str | None = flag(default_from_env="EXAMPLE_PASSWORD")
    """a secret"""


@flag_group
class UndocumentedFlags(FlagGroup):
    TITLE = "undocumented"

    documented: int = flag()
    """a docstring"""
    undocumented: int = flag()


def example_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="example")
    add_flag_group(parser, ExampleFlags)
    return parser


def test_every_config_field_is_one_flag_in_the_order_help_shows_them():
    actions = [a for a in build_parser()._actions if a.dest not in ("help", "version")]
    assert [a.dest for a in actions] == [field.name for field in dataclasses.fields(Config)]
    assert [a.option_strings for a in actions] == [
        [f"--{name}"] for name in flag_names(Config).values()
    ]
    assert flag_names(Config)["processes_per_machine"] == "num_gpus"


def test_a_declared_field_becomes_a_flag_with_its_type_default_and_help():
    group = example_parser()._action_groups[-1]
    assert group.title == "example"
    width, processes, _ = group._group_actions
    assert (width.option_strings, width.dest, width.type, width.default, width.help) == (
        ["--width"],
        "width",
        WIDTH,
        4,
        "how wide, in a docstring of two lines",
    )
    assert (processes.option_strings, processes.dest, processes.metavar, processes.help) == (
        ["--num_workers"],
        "processes",
        "N",
        "how many",
    )


def test_a_flag_without_help_is_refused_as_its_parser_is_built():
    with pytest.raises(TypeError, match="UndocumentedFlags.undocumented has no help"):
        add_flag_group(OneLineParser(prog="example"), UndocumentedFlags)


def test_every_flag_of_the_trainer_has_help():
    assert all(action.help for action in build_parser()._actions)


def test_a_group_is_frozen_and_has_no_field_defaults():
    flags = ExampleFlags(width=4, processes=None, password=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        flags.width = 5  # type: ignore[misc]
    with pytest.raises(TypeError, match="missing 1 required"):
        ExampleFlags(width=4, processes=None)  # type: ignore[call-arg]


def test_the_parsed_flags_build_the_dataclass_that_declares_them(monkeypatch):
    monkeypatch.setenv("EXAMPLE_PASSWORD", "hunter2")  # read as the parser is built
    parsed = example_parser().parse_args(["--num_workers", "3"])
    assert ExampleFlags(**vars(parsed)) == ExampleFlags(width=4, processes=3, password="hunter2")


def test_resnet50_db_bench_takes_the_trainers_read_order_flags():
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    theirs = {action.dest: action for action in parser._actions}
    for name in READ_ORDER_FLAGS:
        ours = flag_actions()[name]
        assert (theirs[name].default, theirs[name].choices, theirs[name].help) == (
            ours.default,
            ours.choices,
            ours.help,
        )
        assert theirs[name].type == ours.type


def test_flags_installed_without_their_source_have_no_help_but_parse(tmp_path, monkeypatch):
    source = tmp_path / "compiled_flags.py"
    source.write_text(
        "from resnet50_trainer.config.flags.declare import FlagGroup, flag, flag_group\n"
        "@flag_group\n"
        "class CompiledFlags(FlagGroup):\n"
        "    TITLE = 'compiled'\n"
        "    width: int = flag(type=int, if_absent=4)\n"
        "    '''how wide'''\n"
    )
    py_compile.compile(str(source), cfile=str(tmp_path / "compiled_flags.pyc"))
    source.unlink()  # a .pyc where its source was: imported from it alone
    monkeypatch.syspath_prepend(str(tmp_path))
    compiled = importlib.import_module("compiled_flags")
    parser = OneLineParser(prog="example")
    add_flag_group(parser, compiled.CompiledFlags)
    (width,) = parser._action_groups[-1]._group_actions
    assert (width.help, parser.parse_args(["--width", "5"]).width) == ("", 5)
