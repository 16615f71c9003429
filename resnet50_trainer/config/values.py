"""What each flag's value may be, checked as argparse reads it: one line and exit 2 otherwise.

A number flag's valid range is part of its definition (`type=Number(...)`), so the check, the
--help text and the tests all read the same range.
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from resnet50_trainer.commands import current_folder_gone
from resnet50_trainer.path_words import shown

# What a timeout of "inf" becomes: torch takes only a finite timedelta (timedelta(seconds=inf)
# overflows), and deadlines of now + timeout must fit its int64 clocks. Ten years is forever here.
NO_TIME_LIMIT_S = 10 * 365 * 24 * 3600
REDIS_SCHEMES = ("redis", "rediss")
_DIGITS = re.compile(r"[0-9]+")
_REDIS_DB_PATH = re.compile(r"/?|/[0-9]+")
_HOST_WITH_PORT = re.compile(r"[^:]+:[^:]*")  # "host:6379"; IPv6 literals hold two colons or more
# A switch's value words, any case: the original's scripts say --use_cpu True (or False, 1, 0).
SWITCH_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


@dataclass(frozen=True)
class Number:
    """An argparse type: an int or float from `minimum` to `maximum` (either end open if asked).

    NaN is never valid, nor is an infinite float, except that where `infinity` is set "inf" is
    valid and stands for that finite value (e.g. a timeout with no practical limit)."""

    kind: type  # int or float
    minimum: float | None = None
    maximum: float | None = None
    above_minimum: bool = False  # the minimum itself is not valid
    below_maximum: bool = False  # the maximum itself is not valid
    infinity: float | None = None

    def __call__(self, text: str) -> int | float:
        try:
            value = self.kind(text)
        except ValueError:
            value = None
        if value == math.inf and self.infinity is not None:
            return self.infinity
        if value is None or not self.holds(value):
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: use {self.describe()}")
        return value

    def holds(self, value: int | float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.minimum is not None and (
            value <= self.minimum if self.above_minimum else value < self.minimum
        ):
            return False
        return self.maximum is None or (
            value < self.maximum if self.below_maximum else value <= self.maximum
        )

    def describe(self) -> str:
        """The valid values in words, e.g. "an integer from 1 to 65535"."""
        noun = "an integer" if self.kind is int else "a number"
        low, high = _plain(self.minimum), _plain(self.maximum)
        if self.minimum is not None and self.maximum is not None:
            start = "above" if self.above_minimum else "from"
            end = (
                "up to (not including)"
                if self.below_maximum
                else "up to"
                if start == "above"
                else "to"
            )
            words = f"{noun} {start} {low} {end} {high}"
        elif self.minimum is not None:
            words = f"{noun} above {low}" if self.above_minimum else f"{noun}, {low} or more"
        else:
            words = noun
        if self.infinity is not None:
            words += f", or inf: no limit (taken as {_plain(self.infinity)})"
        return words


def _plain(value: float | None) -> str:
    """1000000, not 1e+06: the bound as a user would type it."""
    return str(int(value)) if value is not None and value == int(value) else str(value)


REDIS_PORT = Number(int, 1, 65535)
# Ranges shared by the trainer's flags and resnet50-db bench's of the same name.
# ResNet's five stride-2 stages: its last feature map is the image's side / 32, rounded up.
RESNET_STRIDE = 32
PIXELS = Number(int, RESNET_STRIDE, 8192)  # below 32, those stages leave nothing
BATCH_SIZE = Number(int, 1, 1_000_000)
NUM_LABELS = Number(int, 1, 1_000_000)
INPUT_WORKERS = Number(int, 0, 128)
BUILD_WORKERS = Number(int, 1, 128)  # resnet50-db create's and copy's processes
SEED = Number(int, 0, 2**64 - 1)  # what torch.manual_seed takes


def path_value(text: str) -> str:
    """A path flag's value. A relative one needs the current folder, which a shell still stands
    in after it was removed (cd into a folder, remove it, run): refused then, in one line, where
    an absolute one works."""
    if not os.path.isabs(text) and current_folder_gone():
        raise argparse.ArgumentTypeError(
            f"{shown(text)} is relative to the current folder, which no longer exists (removed "
            "after the shell entered it): cd into an existing folder, or give an absolute path"
        )
    return text


ALL_GPUS = (-1,)  # --gpus all: every GPU of this machine (gpu_ids.select_gpus counts them)


def gpu_list(text: str) -> tuple[int, ...]:
    """--gpus: GPU ids separated by commas (select_gpus checks them against this machine's GPUs;
    one listed twice gets two processes, config.gpus_shared), or `all`, as Caffe's `--gpu all`."""
    if text.strip().lower() == "all":
        return ALL_GPUS
    parts = text.split(",")
    if not all(_DIGITS.fullmatch(part) for part in parts):
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: use GPU ids (0, 1, ...) separated by commas, e.g. 0,1, or all"
        )
    return tuple(int(part) for part in parts)


def redis_address(text: str) -> str:
    """--redis_host: a host name, or a redis://[:password@]host[:port][/db] URL whose every part
    is valid, so the rendezvous never meets a bad one. Messages never repeat the URL: it may hold
    a password."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty value: give a host name or a redis:// URL")
    if "://" not in text:
        if _HOST_WITH_PORT.fullmatch(text):
            raise argparse.ArgumentTypeError(
                f"{text!r} holds a port: give it with --redis_port, "
                "or write a redis://host:port URL"
            )
        return text
    try:
        url = urlsplit(text)
    except ValueError as error:  # e.g. an unclosed [IPv6 bracket
        raise argparse.ArgumentTypeError(f"not a valid URL ({error})") from None
    if url.scheme not in REDIS_SCHEMES:
        raise argparse.ArgumentTypeError(
            f"a URL must start with redis:// or rediss://, not {url.scheme}://"
        )
    if not url.hostname:
        raise argparse.ArgumentTypeError("the URL names no host: write redis://host[:port][/db]")
    if not _REDIS_DB_PATH.fullmatch(url.path):
        raise argparse.ArgumentTypeError(
            f"the URL's database {url.path[1:]!r} is not a number: "
            "end the URL with /0, /1, ... or with the host[:port]"
        )
    if url.query or url.fragment:
        raise argparse.ArgumentTypeError(
            "the URL has a '?' or '#' part: write only redis://[:password@]host[:port][/db]"
        )
    _check_url_port(url)
    return text


def _check_url_port(url) -> None:
    """The port as written (urllib's .port takes "+5", raises on "abc" and lets 0 through)."""
    port_text = url.netloc.rpartition("@")[2].rpartition("]")[2].partition(":")[2]
    if port_text and not (_DIGITS.fullmatch(port_text) and REDIS_PORT.holds(int(port_text))):
        raise argparse.ArgumentTypeError(
            f"the URL's port {port_text!r} is not a port: use {REDIS_PORT.describe()}"
        )


def switch_value(text: str) -> bool:
    """A switch's value where one is given. False means off: Python's bool("False"), which the
    original's type=bool flags called, is True, but no script that says False means that."""
    try:
        return SWITCH_WORDS[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"invalid value {text!r}: use true or false (or 1/0, yes/no), "
            "or the flag alone for true"
        ) from None


class Switch(argparse._StoreAction):
    """A boolean flag, off unless given: alone it turns on, as an ordinary switch, and it also
    takes a value as the original's type=bool flags did (--use_cpu True, --use_cpu False). It
    stores that value as argparse's plain store action does."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None):
        super().__init__(
            option_strings,
            dest,
            nargs="?",
            const=True,
            default=False,
            type=switch_value,
            metavar="BOOL",
            help=help,
        )


@dataclass(frozen=True)
class NumberList:
    """An argparse type: numbers, each a `Number`, separated by commas (104,117,123); the
    NumberValues action also takes them apart, as the original's nargs='+' flags did
    (104 117 123). `what`: the numbers, as the refusal names them."""

    number: Number
    what: str = "one number per channel"

    def __call__(self, text: str) -> tuple[float, ...]:
        try:
            return tuple(self.number(part) for part in text.split(","))
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"invalid value {text!r}: use {self.describe()}"
            ) from None

    def describe(self) -> str:
        return f"{self.what}, separated by commas or spaces, each {self.number.describe()}"


@dataclass(frozen=True)
class Bounds:
    """An argparse type: MIN,MAX, two `Number`s separated by a comma, MIN at most MAX."""

    number: Number

    def __call__(self, text: str) -> tuple[float, float]:
        try:
            low, high = (self.number(part) for part in text.split(","))
            if low <= high:
                return low, high
        except (argparse.ArgumentTypeError, ValueError):  # ValueError: not two values
            pass
        raise argparse.ArgumentTypeError(f"invalid value {text!r}: use {self.describe()}")

    def describe(self) -> str:
        return f"MIN,MAX, MIN at most MAX, each {self.number.describe()}"


class NumberValues(argparse.Action):
    """A NumberList flag's values, given together or apart, as one tuple."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs="+", **{"metavar": "VALUE", **kwargs})

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        parts: list[tuple[float, ...]] = values  # type: ignore[assignment]
        setattr(namespace, self.dest, tuple(value for part in parts for value in part))
