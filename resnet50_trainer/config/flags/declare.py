"""A flag declared once, as a field of a flag group's frozen dataclass: the field's name and type
are the setting's (config/settings.py's Config inherits every group's fields), its metadata the
argparse declaration (type and valid values, default, help) that the parsers are built from."""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

# A field's metadata: its add_argument keywords, its flag's name where that is not the field's,
# and the environment variable its default is read from as a parser is built.
_DECLARATION = "add_argument"
_FLAG_NAME = "flag_name"
_DEFAULT_FROM_ENV = "default_from_env"


@dataclass(frozen=True)
class FlagGroup:
    """The base of a group's flags dataclass: each field a flag (declared with `flag`), listed in
    --help under TITLE in field order."""

    TITLE: ClassVar[str]


def flag(
    *,
    help: str,
    type: Callable[[str], Any] | None = None,
    default: Any = None,
    choices: Sequence[Any] | None = None,
    required: bool = False,
    metavar: str | None = None,
    action: Callable[..., argparse.Action] | None = None,
    name: str | None = None,
    default_from_env: str | None = None,
) -> Any:
    """A flag group's field that is also a flag: add_argument's keywords, `name` the flag's name
    where it is not the field's. The field has no dataclass default: a Config is built with every
    field (config/build.py), each flag's default applied by argparse."""
    given = {"type": type, "default": default, "choices": choices, "metavar": metavar}
    # Only what is given: an action such as Switch takes no type and has its own default.
    declaration = {key: value for key, value in given.items() if value is not None}
    if action is not None:
        declaration["action"] = action
    if required:
        declaration["required"] = True
    return dataclasses.field(
        metadata={
            _DECLARATION: {**declaration, "help": help},
            _FLAG_NAME: name,
            _DEFAULT_FROM_ENV: default_from_env,
        }
    )


def flag_name(field: dataclasses.Field) -> str:
    return field.metadata[_FLAG_NAME] or field.name


def flag_names(flags: type[FlagGroup]) -> dict[str, str]:
    """Field name -> flag name, for every field of a flags dataclass (Config's too)."""
    return {field.name: flag_name(field) for field in dataclasses.fields(flags)}


def add_flags(
    container: argparse._ActionsContainer,
    flags: type[FlagGroup],
    names: Collection[str] | None = None,
) -> None:
    """The fields of a flags dataclass (those in `names`, where given) as flags of `container`,
    in field order; each stores its value under its field's name."""
    for field in dataclasses.fields(flags):
        if names is None or field.name in names:
            container.add_argument(f"--{flag_name(field)}", dest=field.name, **_declared(field))


def add_flag_group(parser: argparse.ArgumentParser, flags: type[FlagGroup]) -> None:
    add_flags(parser.add_argument_group(flags.TITLE), flags)


def flag_groups(settings: type[FlagGroup]) -> tuple[type[FlagGroup], ...]:
    """The flag groups a settings dataclass inherits, in its fields' order: dataclasses collects
    fields from the last base to the first."""
    return tuple(base for base in reversed(settings.__bases__) if issubclass(base, FlagGroup))


def _declared(field: dataclasses.Field) -> dict[str, Any]:
    declaration = dict(field.metadata[_DECLARATION])
    variable = field.metadata[_DEFAULT_FROM_ENV]
    if variable is not None:
        declaration["default"] = os.environ.get(variable)  # as the parser is built, not imported
    return declaration
