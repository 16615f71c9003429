"""docs/flags.md is the parser's own words: regenerated, it is the file as committed."""

from __future__ import annotations

import importlib.util
import os

from tests.support.trainer_runs import REPOSITORY


def _writer():
    path = os.path.join(REPOSITORY, "scripts", "write_flags_doc.py")
    spec = importlib.util.spec_from_file_location("write_flags_doc", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_flag_reference_is_generated_from_the_parser():
    writer = _writer()
    with open(writer.PAGE) as file:
        committed = file.read()
    assert committed == writer.render(), "docs/flags.md is stale: python scripts/write_flags_doc.py"


def test_every_flag_has_a_row():
    writer = _writer()
    page = writer.render()
    flags = [
        option
        for action in writer.build_parser()._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    ]
    assert flags and all(f"`{flag}`" in page for flag in flags)
