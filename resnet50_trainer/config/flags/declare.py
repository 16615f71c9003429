"""A flag declared once, as a field of a flag group's frozen dataclass: the field's name and type
are the setting's (config/settings.py's Config inherits every group's fields), its docstring the
flag's help, and its metadata the rest of the argparse declaration (type and valid values, the
value when the flag is absent) that the parsers are built from."""

from __future__ import annotations

import argparse
import ast
import collections
import dataclasses
import functools
import inspect
import os
import sys
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

if sys.version_info >= (3, 11):
    from typing import dataclass_transform
else:
    from typing_extensions import dataclass_transform

# A field's metadata: its add_argument keywords, its flag's name where that is not the field's,
# and the environment variable its default is read from as a parser is built.
_DECLARATION = "add_argument"
_FLAG_NAME = "flag_name"
_DEFAULT_FROM_ENV = "default_from_env"

Group = TypeVar("Group", bound="type[FlagGroup]")


@dataclass(frozen=True)
class FlagGroup:
    """The base of a group's flags dataclass: each field a flag (declared with `flag`), listed in
    --help under TITLE in field order."""

    TITLE: ClassVar[str]


def flag(
    *,
    type: Callable[[str], Any] | None = None,
    if_absent: Any = None,
    choices: Sequence[Any] | None = None,
    required: bool = False,
    metavar: str | None = None,
    action: Callable[..., argparse.Action] | None = None,
    name: str | None = None,
    default_from_env: str | None = None,
    help: str | None = None,
) -> Any:
    """A flag group's field that is also a flag: add_argument's keywords (`if_absent` is its
    `default`), `name` the flag's name where it is not the field's. Its help is the docstring
    under the field, or `help` where the text is built (from a registry, or by a function that
    makes several flags). The field has no dataclass default: a Config is built with every field
    (config/build.py), each flag's default applied by argparse."""
    given = {"type": type, "default": if_absent, "choices": choices, "metavar": metavar}
    given["help"] = help
    # Only what is given: an action such as Switch takes no type and has its own default.
    declaration = {key: value for key, value in given.items() if value is not None}
    if action is not None:
        declaration["action"] = action
    if required:
        declaration["required"] = True
    return dataclasses.field(
        metadata={
            _DECLARATION: declaration,
            _FLAG_NAME: name,
            _DEFAULT_FROM_ENV: default_from_env,
        }
    )


# For type checkers: a group's fields are its __init__'s parameters, none with a default (flag's
# `if_absent` is argparse's default, not the field's), and its instances are frozen.
@dataclass_transform(frozen_default=True, field_specifiers=(flag,))
def flag_group(group: Group) -> Group:
    """A flags dataclass, frozen: `@flag_group class XFlags(FlagGroup)`."""
    dataclass(frozen=True)(group)  # in place: a dataclass without slots is its class
    return group


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
            declaration = _declared(field)
            if "help" not in declaration:
                declaration["help"] = _docstring(flags, field.name)
            container.add_argument(f"--{flag_name(field)}", dest=field.name, **declaration)


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


def _docstring(flags: type[FlagGroup], name: str) -> str:
    declaring = next(
        group for group in flags.__mro__ if name in vars(group).get("__annotations__", {})
    )
    docstrings = _docstrings(declaring.__module__)
    if docstrings is None:  # installed without its source (.pyc only): flags without help
        return ""
    try:
        return docstrings[declaring.__name__][name]
    except KeyError:
        raise TypeError(
            f"{declaring.__qualname__}.{name} has no help: write its docstring under the field"
        ) from None


@functools.cache
def _docstrings(module: str) -> dict[str, dict[str, str]] | None:
    """The docstring under each field of each class of a module, by class and field name, read
    from its source (Python keeps none of a field's), its lines joined; None without the source."""
    try:
        source = inspect.getsource(sys.modules[module])
    except OSError:
        return None
    found: dict[str, dict[str, str]] = collections.defaultdict(dict)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for field, after in zip(node.body, node.body[1:]):
                if (
                    isinstance(field, ast.AnnAssign)
                    and isinstance(field.target, ast.Name)
                    and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)
                ):
                    found[node.name][field.target.id] = " ".join(after.value.value.split())
    return found
