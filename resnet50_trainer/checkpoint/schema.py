"""What a checkpoint holds, defined once: the fields the trainer writes, what each may be when
read back (field_problem: a file from elsewhere is checked before a resume touches it), and how
they are composed of the entries their parts own (Replica.checkpoint_entries,
RunState.checkpoint_entry, grad_compression_entry, settings_entry). Stored as a plain dict of
state dicts, numbers and settings, so it loads with torch.load(weights_only=True).

Fields not defined here are ignored when read: torch_rng_state, which earlier versions wrote, is
one (nothing after the weights' initialisation draws from torch's generator)."""

from __future__ import annotations

import dataclasses
import math
import re
import uuid
from dataclasses import dataclass, fields
from typing import Any, Callable

import torch

from resnet50_trainer.checkpoint.grad_compression_entry import entry_problem
from resnet50_trainer.config.flags.model import RESNET_GROUPS, RESNET_WIDTH_PER_GROUP
from resnet50_trainer.config.settings import Config
from resnet50_trainer.errors import UserError
from resnet50_trainer.model.finite import non_finite_tensors

EPOCH_SUMS = 4  # loss x images, correct, images, bad records
# The lineage of checkpoints written before lineages existed: they count as one run's.
UNMARKED_LINEAGE = ""
_LINEAGE = re.compile(r"[0-9a-f]{32}")  # new_lineage's
_NUMBER = (int, float)


def new_lineage() -> str:
    return uuid.uuid4().hex


def _named_tensors(model: dict) -> str | None:
    if all(
        isinstance(key, str) and isinstance(value, torch.Tensor) for key, value in model.items()
    ):
        return None
    return "a model state that is not named tensors"


def _made_by_new_lineage(lineage: str) -> str | None:
    if _LINEAGE.fullmatch(lineage):
        return None
    return f"a lineage {lineage[:40]!r} that new_lineage() never makes"


def _ema_problem(ema: dict | None) -> str | None:
    """--ema_decay's average: {"model": named tensors, "updates": a count}; None without one."""
    if ema is None:
        return None
    updates = ema.get("updates")
    if (
        not isinstance(ema.get("model"), dict)
        or isinstance(updates, bool)
        or not isinstance(updates, int)
        or not 0 <= updates < 2**63
    ):
        return "an EMA that is not weights and a count of updates"
    return _named_tensors(ema["model"])


def _read_order_problem(order: dict) -> str | None:
    """{"run_length": n, "window_runs": m}, both whole numbers from 1."""
    if order.keys() == {"run_length", "window_runs"} and all(
        type(value) is int and 1 <= value < 2**63 for value in order.values()
    ):
        return None
    return "a read order that is not a run length and a window of runs"


def _spec(
    types: Any,
    least: int | None = None,
    optional: bool = False,
    check: Callable[[Any], str | None] | None = None,
) -> Any:
    """A field's rule for reading: its types (a bool never counts as a number), the smallest
    number it may be, whether it may be absent, and a check of its contents."""
    return dataclasses.field(
        metadata={"types": types, "least": least, "optional": optional, "check": check}
    )


@dataclass(frozen=True)
class CheckpointFields:
    model: dict = _spec(dict, check=_named_tensors)  # torchvision's names: no `module.` prefix
    optimizer: dict = _spec(dict)
    arguments: dict = _spec(dict)  # the run's settings: a resume checks the architecture
    scaler: dict | None = _spec((dict, type(None)), optional=True)  # {} without float16
    epoch: int = _spec(int, least=0)  # epochs completed
    step: int = _spec(int, least=0)  # steps into the next epoch
    iteration: int = _spec(int, least=0)
    seed: int = _spec(int, least=0)  # a resume warns of a change
    total_images: int = _spec(int, least=0)
    global_batch_size: int = _spec(int, least=1)  # a resume continues from the records read
    world_size: int = _spec(int, least=1)  # a resume on another count says so
    learning_rate: float = _spec(_NUMBER, least=0)  # of the next step: a resume warns of a change
    epoch_seconds: float = _spec(_NUMBER, least=0)
    total_seconds: float = _spec(_NUMBER, least=0)
    # The epoch's global sums so far (EPOCH_SUMS of them) in a mid-epoch checkpoint, else None.
    epoch_sums: torch.Tensor | None = _spec((torch.Tensor, type(None)))
    lineage: str = _spec(str, optional=True, check=_made_by_new_lineage)
    # The average of the weights with --ema_decay (ema.py), else None.
    ema: dict | None = _spec((dict, type(None)), optional=True, check=_ema_problem)
    # --grad_compression and PowerSGD's state (grad_compression_entry.py); absent: none.
    grad_compression: dict | None = _spec((dict, type(None)), optional=True, check=entry_problem)
    # The order the checkpoint's epoch reads in (RunState.read_order); absent: random.
    read_order: dict = _spec(dict, optional=True, check=_read_order_problem)


REQUIRED_KEYS = frozenset(
    field.name for field in fields(CheckpointFields) if not field.metadata["optional"]
)


def compose(*entries: dict) -> dict:
    """A checkpoint from its parts' entries (the replica's, the run state's, gradient
    compression's, the run's settings): together they give every field once, in the order
    CheckpointFields defines. A field given twice or not at all is the trainer's own bug."""
    given: dict = {}
    for entry in entries:
        twice = given.keys() & entry.keys()
        if twice:
            raise ValueError(f"checkpoint fields {sorted(twice)} given by two entries")
        given.update(entry)
    names = [field.name for field in fields(CheckpointFields)]
    if given.keys() != set(names):
        missing, unknown = set(names) - given.keys(), given.keys() - set(names)
        raise ValueError(f"checkpoint fields missing {sorted(missing)}, unknown {sorted(unknown)}")
    return {name: given[name] for name in names}


def settings_entry(config: Config, world_size: int, lineage: str, learning_rate: float) -> dict:
    """Which run a checkpoint is of: its settings, seed, batch and size, its lineage, and the LR
    of its next step (a resume warns where any of these changed)."""
    return {
        "arguments": config.to_dict(),
        "seed": config.seed,
        "global_batch_size": config.global_batch_size,
        "world_size": world_size,
        "learning_rate": learning_rate,
        "lineage": lineage,
    }


def position(state: dict) -> tuple[int, int, int, str | None]:
    """(epochs done, steps into the next, iteration, lineage or None): which point of which run."""
    return state["epoch"], state["step"], state["iteration"], state.get("lineage")


def field_problem(state: dict) -> str | None:
    """What is wrong with the fields of a checkpoint read back, or None: types, signs, contents."""
    specs = [
        (field.name, field.metadata) for field in fields(CheckpointFields) if field.name in state
    ]
    for name, spec in specs:
        value = state[name]
        if isinstance(value, bool) or not isinstance(value, spec["types"]):
            return f"field {name} of type {type(value).__name__}"
    for name, spec in specs:
        value, least = state[name], spec["least"]
        if least is not None and (
            value < least or isinstance(value, float) and not math.isfinite(value)
        ):
            return f"field {name} = {value}, not a number of at least {least}"
    for name, spec in specs:
        problem = spec["check"] and spec["check"](state[name])
        if problem:
            return problem
    return _epoch_sums_problem(state) or _non_finite_problem(state)


def _epoch_sums_problem(state: dict) -> str | None:
    """A mid-epoch checkpoint (step > 0) carries the epoch's sums so far, an epoch's end none; the
    sums are loss x images, correct, images, bad records: finite, not negative, consistent."""
    sums, step = state["epoch_sums"], state["step"]
    if (sums is None) != (step == 0):
        return f"step {step} {'without' if sums is None else 'with'} the epoch's sums"
    if sums is None:
        return None
    if sums.shape != (EPOCH_SUMS,):
        return f"epoch_sums of shape {tuple(sums.shape)}, not ({EPOCH_SUMS},)"
    loss, correct, images, bad = sums.tolist()
    if (
        not all(math.isfinite(value) and value >= 0 for value in (loss, correct, images, bad))
        or not 1 <= images
        or correct > images
        or bad > images
    ):
        return f"epoch_sums {[loss, correct, images, bad]} that no epoch adds up to"
    return None


def _non_finite_problem(state: dict) -> str | None:
    """Weights or momentum that are no longer finite: a resume would only diverge again."""
    momentum = {
        f"momentum of parameter {index}": entry.get("momentum_buffer")
        for index, entry in state["optimizer"].get("state", {}).items()
        if isinstance(entry, dict)
    }
    tensors = {
        **state["model"],
        **{name: buffer for name, buffer in momentum.items() if isinstance(buffer, torch.Tensor)},
        **{f"EMA {name}": tensor for name, tensor in ema_weights(state).items()},
    }
    bad = non_finite_tensors(tensors)
    return (
        f"non-finite values in {bad[0]}{f' and {len(bad) - 1} more' if len(bad) > 1 else ''}"
        if bad
        else None
    )


def ema_weights(state: dict) -> dict:
    """The checkpoint's EMA weights (torchvision's names); empty without an EMA."""
    return (state.get("ema") or {}).get("model", {})


ARCHITECTURE_DEFAULTS = {
    "resnext_num_groups": RESNET_GROUPS,
    "resnext_width_per_group": RESNET_WIDTH_PER_GROUP,
}
# Not the architecture, but the optimizer's parameter groups, which a resume's momentum must fit
# (--test_only reads no optimizer); as saved before the flag existed.
OPTIMIZER_DEFAULTS = {"no_bn_weight_decay": False}


def check_matches(state: dict, config: Config) -> None:
    """A checkpoint of another architecture or label count cannot continue this run."""
    # A checkpoint from before the ResNeXt flags holds a plain ResNet.
    saved = {**ARCHITECTURE_DEFAULTS, **OPTIMIZER_DEFAULTS, **state.get("arguments", {})}
    optimizer = () if config.test_only else tuple(OPTIMIZER_DEFAULTS)
    for name in ("num_layers", "num_labels", "num_channels", *ARCHITECTURE_DEFAULTS, *optimizer):
        if saved.get(name) != getattr(config, name):
            raise UserError(
                f"checkpoint {state['path']} was made with --{name} {saved.get(name)}, "
                f"this run has {getattr(config, name)}: use the same value or another "
                "checkpoint"
            )


def check_fits(
    state: dict, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> None:
    """Every saved tensor has the shape of this run's: one line, not load_state_dict's traceback
    or a momentum buffer that fails at the first step. Shapes only, so a model on the meta device
    serves as well. `optimizer`: None where none is resumed (--test_only)."""
    expected = model.state_dict()
    ema = ema_weights(state)
    ema_problem = model_problem(ema, expected) if ema else None
    problem = (
        model_problem(state["model"], expected)
        or (optimizer and _optimizer_problem(state["optimizer"], optimizer))
        or (ema_problem and f"an EMA with {ema_problem}")
    )
    if problem:
        raise UserError(
            f"checkpoint {state['path']} has {problem}: it was not made for this "
            "model; give a checkpoint of this run's --num_layers, --num_labels and "
            "--num_channels"
        )


def model_problem(saved: dict, expected: dict) -> str | None:
    """How the saved model tensors differ from a model's state dict `expected`: names, shapes."""
    unknown = sorted(saved.keys() - expected.keys()) or sorted(expected.keys() - saved.keys())
    if unknown:
        relation = "unknown to" if unknown[0] in saved else "missing for"
        return f"model tensor {unknown[0]} {relation} this model"
    wrong = [
        name for name in expected if name in saved and saved[name].shape != expected[name].shape
    ]
    if wrong:
        return (
            f"model tensor {wrong[0]} of shape {tuple(saved[wrong[0]].shape)}, this "
            f"model's is {tuple(expected[wrong[0]].shape)}"
        )
    return None


def _optimizer_problem(saved: dict, optimizer: torch.optim.Optimizer) -> str | None:
    groups, states = saved.get("param_groups"), saved.get("state")
    if (
        not isinstance(groups, list)
        or not isinstance(states, dict)
        or not all(
            isinstance(group, dict) and isinstance(group.get("params"), list) for group in groups
        )
    ):
        return "an optimizer state without param_groups and state"
    ours = optimizer.param_groups
    if [len(group["params"]) for group in groups] != [len(group["params"]) for group in ours]:
        return "an optimizer of other parameter groups"
    parameters = [p for group in optimizer.param_groups for p in group["params"]]
    for index, entry in states.items():
        buffer = entry.get("momentum_buffer") if isinstance(entry, dict) else "not a dict"
        fits = (
            isinstance(index, int)
            and 0 <= index < len(parameters)
            and (
                buffer is None
                or isinstance(buffer, torch.Tensor)
                and buffer.shape == parameters[index].shape
            )
        )
        if not fits:
            return f"an optimizer state (entry {index}) that fits no parameter of this model"
    return None
