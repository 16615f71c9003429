"""The machinery of a --solver file's translation into flags (solver.py reads the fields): each
value checked as its flag checks its own, kept beneath the command line's, and a line saying what
it became; refusals name the file."""

from __future__ import annotations

import argparse
import struct

from google.protobuf.message import Message

from resnet50_trainer.config.flags.parser import flag_actions
from resnet50_trainer.config.launchers import Launched
from resnet50_trainer.errors import UserError


class Translation:
    """A solver file's values for flags, and the lines saying what each field became."""

    def __init__(
        self,
        solver: Message,
        path: str,
        given: set[str],
        args: argparse.Namespace,
        launched: Launched | None,
    ):
        self.solver, self.path, self.given, self.args = solver, path, given, args
        self.launched = launched
        # The file's gamma, power, stepsize and stepvalue shape its own lr_policy only.
        self.policy_applies = "lr_policy" not in given
        self.values: dict[str, object] = {}
        self.lines: list[str] = []
        self.actions = flag_actions()

    def refuse(self, problem: str) -> UserError:
        return UserError(f"--solver {self.path}: {problem}")

    def has(self, field: str) -> bool:
        """Whether the file sets `field` (Caffe's defaults are not settings of the file)."""
        value = getattr(self.solver, field)
        if isinstance(value, (str, int, float)):  # a bool too: not a repeated field
            return self.solver.HasField(field)
        return len(value) > 0

    def set_flag(self, field: str, dest: str, value: object, suffix: str = "") -> None:
        """`value` checked as the flag checks its own, then kept for `dest` unless given."""
        action = self.actions[dest]
        if callable(action.type):
            # The flag's own reading of the value as text: a tuple as the flag's comma list.
            text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
            try:
                value = action.type(text)
            except argparse.ArgumentTypeError as error:
                raise self.refuse(f"{field}: {error}") from None
        if action.choices is not None and value not in action.choices:
            raise self.refuse(f"{field}: {value!r} is not one of {', '.join(action.choices)}")
        self.values[dest] = value
        flag = action.option_strings[0]
        line = f"{field} -> {flag} {as_flag_text(value)}{suffix}"
        if dest in self.given:
            given = as_flag_text(getattr(self.args, dest))
            line += f", not used: the command line's {flag} {given} wins"
        self.lines.append(line)

    def note(self, field: str, why: str) -> None:
        self.lines.append(f"{field}: not used: {why}")


def as_flag_text(value: object) -> str:
    if isinstance(value, tuple):
        return ",".join(f"{part:g}" for part in value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def decimal(value: float) -> float:
    """A float32 field's value as written in the file: 0.1, not 0.10000000149011612."""
    for digits in range(1, 10):
        text = f"{value:.{digits}g}"
        if struct.unpack("f", struct.pack("f", float(text)))[0] == value:
            return float(text)
    return value


def enum_name(solver: Message, enum: str, number: int) -> str:
    return solver.DESCRIPTOR.enum_types_by_name[enum].values_by_number[number].name
