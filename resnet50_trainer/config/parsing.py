"""The command lines' parser machinery: a parser whose refusals are one line (exit 2), --version,
--help's formatter (each default once, a number flag's valid values), and a flag's valid values
in words for the flag reference (docs/flags.md)."""

from __future__ import annotations

import argparse
import re
import sys
from typing import NoReturn

from resnet50_trainer.config.values import SWITCH_WORDS, Bounds, Number, NumberList, Switch
from resnet50_trainer.errors import USAGE_EXIT_STATUS, error_line

_NEGATIVE_NUMBER = re.compile(
    r"^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE
)


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose refusals are one line (no usage block), exit status 2."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # argparse takes only "-1" and "-1.5" for values; "-inf" or "-1e308" would read as an
        # unknown option ("expected one argument"), not as the bad number it is.
        self._negative_number_matcher = _NEGATIVE_NUMBER

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())
        print(error_line(self.prog, f"{message} (see --help)"), file=sys.stderr)
        sys.exit(USAGE_EXIT_STATUS)


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    """--version: the command's name and the package's version, and exit 0 (before any other
    flag is checked, so it needs none of the required ones)."""
    from resnet50_trainer import __version__

    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="show the version"
    )


HELP_DEFAULT = "(default: "  # how --help shows a default, once per flag


class FlagHelpFormatter(argparse.HelpFormatter):
    """--help: each flag's default where it has one, and a number flag's valid values, read from
    the Number that checks them (a flag with choices shows those)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        notes = []
        # A help text that states its default itself, as "(default: ...)", knows better (and
        # $REDIS_PASSWORD's value must never be shown).
        stated = HELP_DEFAULT in (action.help or "")
        if not stated and all(
            action.default is not no_value for no_value in (None, False, argparse.SUPPRESS)
        ):
            notes.append("default: %(default)s")
        if isinstance(action.type, Number) and not action.choices:
            notes.append(f"valid: {action.type.describe()}")
        return " ".join([action.help or "", *(f"({note})" for note in notes)]).strip()


def valid_values(action: argparse.Action) -> str:
    """A flag's valid values in words, as its type or choices check them (the flag reference,
    docs/flags.md, shows them; --help shows a Number's)."""
    if action.choices:
        return ", ".join(str(choice) for choice in action.choices)
    if isinstance(action.type, (Number, NumberList, Bounds)):
        return action.type.describe()
    if isinstance(action, Switch):
        return "alone: on; or a value: " + "/".join(SWITCH_WORDS)
    return ""
