"""The LR policies (--lr_policy), each written once: one entry a policy holds its help, the flags it
reads and needs, its own rules, its start-line words, its maths and its Caffe solver side. The
flags (flags/optimisation.py) and their checks (checks.py), a solver file's translation
(solver.py) and the schedule (model/lr_schedule.py) read these entries; adding a policy is one
entry and its test. Also the LR's scaling to the global batch (--lr_scaling). Torch-free, as
config/ is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from resnet50_trainer.errors import UserError

# --lr_scaling: linear follows the original's docs (the base LR is "based on 256 global batch
# size"); none, the original's code (the base LR as given).
LINEAR_LR_SCALING = "linear"
LR_SCALINGS = (LINEAR_LR_SCALING, "none")
LR_REFERENCE_BATCH = 256
# The original's step policy: x0.1 every 30 epochs of iterations.
DEFAULT_STEP_EPOCHS = 30.0
DEFAULT_GAMMA = 0.1
DEFAULT_POWER = 1.0
DEFAULT_MIN_LR = 0.0
# The flags that shape a policy, in the order their refusals are checked.
POLICY_FLAGS = ("lr_steps", "lr_gamma", "lr_power", "min_lr")
# Epochs x iterations per epoch are whole iterations but for float rounding (a solver's
# stepsize 7 over epochs of 3 iterations is 7 / 3 epochs, 7.000000000000001 iterations again).
_ROUNDING = 1e-9


def effective_learning_rate(
    base_learning_rate: float, global_batch_size: int, lr_scaling: str
) -> float:
    """Linear scaling (Goyal et al. 2017), as the original's docs promised but its code did not
    do; or, with --lr_scaling none, the base LR as given, as its code did."""
    if lr_scaling != LINEAR_LR_SCALING:
        return base_learning_rate
    return base_learning_rate * global_batch_size / LR_REFERENCE_BATCH


def learning_rate_origin(base_learning_rate: float, global_batch_size: int, lr_scaling: str) -> str:
    """How the effective LR comes from --base_learning_rate, as the start line says it."""
    if lr_scaling != LINEAR_LR_SCALING:
        return f"base {base_learning_rate:g} as given: --lr_scaling {lr_scaling}"
    return f"base {base_learning_rate:g} x {global_batch_size} / {LR_REFERENCE_BATCH}"


class Schedule(Protocol):
    """The numbers of a run's schedule that a policy's maths and words read (LearningRateSchedule
    in model/lr_schedule.py)."""

    @property
    def peak_lr(self) -> float: ...
    @property
    def iterations_per_epoch(self) -> int: ...
    @property
    def steps(self) -> tuple[float, ...]: ...  # epochs: step's period, multistep's marks
    @property
    def gamma(self) -> float: ...
    @property
    def power(self) -> float: ...
    @property
    def min_lr(self) -> float: ...
    def progress(self, iteration: int) -> float:
        """From 0 at the end of the warm-up to 1 at the end of the run."""
        ...


@dataclass(frozen=True)
class CaffePolicy:
    """The policy as Caffe's solver.cpp GetLearningRate has it: the solver fields it reads besides
    base_lr; those that become a flag as written; and the one, counted in iterations, that becomes
    a flag in epochs (convert: the field's value and the iterations of an epoch to the flag's)."""

    reads: tuple[str, ...] = ()
    as_written: tuple[tuple[str, str], ...] = ()  # (field, flag)
    in_epochs: tuple[str, str, Callable[[Any, int], object], str] | None = None  # + line suffix


@dataclass(frozen=True)
class LrPolicy:
    name: str
    help: str  # for --lr_policy's help; policies of the same words are listed together
    lr: Callable[[Schedule, int], float]  # the LR at an iteration, before the warm-up
    describe: Callable[[Schedule], str]  # the start line's words
    reads: tuple[str, ...] = ()  # of POLICY_FLAGS
    needs: tuple[str, ...] = ()  # of reads: those with no default that fits every run
    steps_help: str = ""  # what --lr_steps is to it, where it reads them
    gamma_at_most_one: bool = False  # a gamma above 1 would raise the LR at every step without end
    check_steps: Callable[[str, tuple[float, ...]], None] | None = None  # its rule on --lr_steps
    caffe: CaffePolicy | None = None  # None: not one of Caffe's
    by_run_length: bool = False  # its LR at an iteration depends on --num_epochs


def _epochs(steps: tuple[float, ...]) -> str:
    return ", ".join(f"{epoch:g}" for epoch in steps)


def _one_period(name: str, steps: tuple[float, ...]) -> None:
    if len(steps) != 1:
        raise UserError(
            f"--lr_policy {name} takes one --lr_steps value, the epochs between drops "
            f"(got {len(steps)}): for drops at given epochs use --lr_policy multistep"
        )


def _increasing(name: str, steps: tuple[float, ...]) -> None:
    if list(steps) != sorted(set(steps)):
        raise UserError(
            f"--lr_steps of --lr_policy {name} are the epochs of the drops, each after the "
            "one before: give them in increasing order, no repeats"
        )


def _step(s: Schedule, iteration: int) -> float:
    # floor(i / period), the period in (fractional) iterations, at least one.
    period = max(1.0, s.steps[0] * s.iterations_per_epoch)
    return s.peak_lr * s.gamma ** math.floor(iteration / period + _ROUNDING)


def _multistep(s: Schedule, iteration: int) -> float:
    # Each drop at the first iteration of its epoch mark.
    per_epoch = s.iterations_per_epoch
    passed = sum(iteration >= math.ceil(epoch * per_epoch - _ROUNDING) for epoch in s.steps)
    return s.peak_lr * s.gamma**passed


def _to_min_lr(decay: Callable[[Schedule, float], float]) -> Callable[[Schedule, int], float]:
    """A policy that runs from the peak at the warm-up's end to --min_lr at the run's end."""
    return lambda s, i: s.min_lr + (s.peak_lr - s.min_lr) * decay(s, s.progress(i))


_TO_MIN_LR = "down to --min_lr at the run's end"


def _drops(
    name: str,
    help: str,
    lr: Callable[[Schedule, int], float],
    describe: Callable[[Schedule], str],
    *,
    needs: tuple[str, ...] = (),
    steps_help: str,
    check_steps: Callable[[str, tuple[float, ...]], None],
    caffe_field: str,
    to_epochs: Callable[[Any, int], object],
) -> LrPolicy:
    """step and multistep: the LR x --lr_gamma at each drop, the drops where --lr_steps (epochs)
    say; in Caffe, gamma and `caffe_field`, in iterations, which `to_epochs` makes --lr_steps."""
    return LrPolicy(
        name,
        help,
        lr,
        describe,
        reads=("lr_steps", "lr_gamma"),
        needs=needs,
        steps_help=steps_help,
        gamma_at_most_one=True,
        check_steps=check_steps,
        caffe=CaffePolicy(
            ("gamma", caffe_field),
            as_written=(("gamma", "lr_gamma"),),
            in_epochs=(caffe_field, "lr_steps", to_epochs, " epochs"),
        ),
    )


POLICIES = (
    _drops(
        "step",
        f"x gamma every --lr_steps epochs ({DEFAULT_STEP_EPOCHS:g} unless given, the original's)",
        _step,
        lambda s: f"x{s.gamma:g} every {_epochs(s.steps)} epochs",
        steps_help="the epochs between drops (one value)",
        check_steps=_one_period,
        caffe_field="stepsize",
        to_epochs=lambda size, n: (size / n,),
    ),
    _drops(
        "multistep",
        "x gamma at each of the --lr_steps epochs",
        _multistep,
        lambda s: f"x{s.gamma:g} at epochs {_epochs(s.steps)}",
        needs=("lr_steps",),
        steps_help="the epochs of the drops",
        check_steps=_increasing,
        caffe_field="stepvalue",
        to_epochs=lambda values, n: tuple(value / n for value in values),
    ),
    LrPolicy(
        "cosine",
        _TO_MIN_LR,
        _to_min_lr(lambda s, done: 0.5 * (1 + math.cos(math.pi * done))),
        lambda s: f"cosine to {s.min_lr:g}",
        reads=("min_lr",),
        by_run_length=True,
    ),
    LrPolicy(
        "poly",
        _TO_MIN_LR,
        _to_min_lr(lambda s, done: (1 - done) ** s.power),
        lambda s: f"poly (power {s.power:g}) to {s.min_lr:g}",
        reads=("lr_power", "min_lr"),
        caffe=CaffePolicy(("power",), as_written=(("power", "lr_power"),)),
        by_run_length=True,
    ),
    LrPolicy(
        "exp",
        "x gamma per epoch",
        # gamma per epoch, applied smoothly every iteration
        lambda s, i: s.peak_lr * s.gamma ** (i / s.iterations_per_epoch),
        lambda s: f"x{s.gamma:g} per epoch",
        reads=("lr_gamma",),
        needs=("lr_gamma",),
        gamma_at_most_one=True,
        # Caffe's gamma per iteration -> per epoch
        caffe=CaffePolicy(
            ("gamma",), in_epochs=("gamma", "lr_gamma", lambda gamma, n: gamma**n, " (per epoch)")
        ),
    ),
    LrPolicy(
        "inv",
        "(1 + gamma x epochs) ^ -power",
        lambda s, i: s.peak_lr * (1 + s.gamma * i / s.iterations_per_epoch) ** -s.power,
        lambda s: f"inv (gamma {s.gamma:g} per epoch, power {s.power:g})",
        reads=("lr_gamma", "lr_power"),
        needs=("lr_gamma", "lr_power"),
        caffe=CaffePolicy(
            ("gamma", "power"),
            as_written=(("power", "lr_power"),),
            in_epochs=("gamma", "lr_gamma", lambda gamma, n: gamma * n, " (per epoch)"),
        ),
    ),
    LrPolicy("fixed", "", lambda s, i: s.peak_lr, lambda s: "fixed", caffe=CaffePolicy()),
)
BY_NAME = {policy.name: policy for policy in POLICIES}
LR_POLICIES = tuple(BY_NAME)
DEFAULT_LR_POLICY = "step"  # the original's
CAFFE_POLICIES = {policy.name: policy.caffe for policy in POLICIES if policy.caffe is not None}


def readers(flag: str, needing: bool | None = None) -> list[str]:
    """The policies that read `flag`: all of them, or only those that need it (True) or not."""
    return [
        policy.name
        for policy in POLICIES
        if flag in policy.reads and needing in (None, flag in policy.needs)
    ]


def listed(names: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return " and ".join(filter(None, (", ".join(names[:-1]), names[-1]))) if names else ""


def policy_help() -> str:
    """--lr_policy's help: each policy's words, policies of the same words together."""
    parts: list[tuple[list[str], str]] = []
    for policy in POLICIES:
        if parts and parts[-1][1] == policy.help:
            parts[-1][0].append(policy.name)
        else:
            parts.append(([policy.name], policy.help))
    return "; ".join(
        f"{', '.join(names)}: {words}" if words else ", ".join(names) for names, words in parts
    )


def steps_help() -> str:
    return "; ".join(f"{p.name}: {p.steps_help}" for p in POLICIES if "lr_steps" in p.reads)
