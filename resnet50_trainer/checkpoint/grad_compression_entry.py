"""--grad_compression in checkpoints: the entry a checkpoint holds, its check when read back, and
how a resume takes it up.

The entry is {"mode": ...}; with powersgd also "rank" (--powersgd_rank), "rng" (the numpy
generator that draws fresh Q factors, the same on every process), "factors" (the Q factors by
parameter name, the same on every process; None before warm start) and "errors": every process's
error feedback, one row per rank in the model's parameter order, or None before compression
began. The error feedback differs between processes, and the first process writes the one file:
the others send it their rows when a checkpoint is taken (world size x the parameters' size, e.g.
100 MB a process for ResNet-50)."""

from __future__ import annotations

import logging
import math

import torch
import torch.distributed as dist

from resnet50_trainer.config.settings import Config
from resnet50_trainer.distributed import process_group
from resnet50_trainer.distributed.grad_compression import MODES, NONE, POWERSGD, GradCompression
from resnet50_trainer.distributed.powersgd_state import RNG_KEYS, ResumablePowerSGD, factor_shapes
from resnet50_trainer.distributed.process_group import Placement
from resnet50_trainer.errors import UserError

log = logging.getLogger(__name__)


def checkpoint_entry(
    compression: GradCompression, placement: Placement, device: torch.device
) -> dict:
    """The entry of a checkpoint, on every process (it gathers the error feedback to the first;
    the others' return value is not written)."""
    powersgd = compression.powersgd
    if powersgd is None:
        return {"mode": compression.mode}
    return {
        "mode": POWERSGD,
        "rank": compression.rank,
        "rng": powersgd.rng_state(),
        "factors": _on_cpu(powersgd.factors()),
        "errors": _gathered_errors(powersgd, placement, device),
    }


def _on_cpu(tensors: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor] | None:
    return (
        None if tensors is None else {name: t.to("cpu", copy=True) for name, t in tensors.items()}
    )


def _gathered_errors(
    powersgd: ResumablePowerSGD, placement: Placement, device: torch.device
) -> torch.Tensor | None:
    """Every rank's error feedback as rows of one tensor, on the first process; None elsewhere and
    before compression began (which every process reaches at the same iteration)."""
    errors = powersgd.errors()
    if not errors:
        return None
    flat = torch.cat([errors[name].reshape(-1).to(device) for name in powersgd.shapes])
    rows = torch.empty((placement.world_size, flat.numel()), dtype=flat.dtype)
    rows[placement.rank].copy_(flat)
    with process_group.waiting_for_peers("the gathering of PowerSGD's error feedback"):
        if not placement.is_main:
            dist.send(flat, dst=0)
            return None
        for source in range(1, placement.world_size):  # one row at a time: little device memory
            dist.recv(flat, src=source)
            rows[source].copy_(flat)
    return rows


def entry_problem(entry: dict | None) -> str | None:
    """What is wrong with a checkpoint's grad_compression entry as read back, or None."""
    if entry is None:  # a checkpoint composed without one: no compression
        return None
    mode = entry.get("mode")
    if mode not in MODES:
        return f"a grad_compression mode {str(mode)[:40]!r} that no run writes"
    if mode != POWERSGD:
        return None
    rng, errors, factors = entry.get("rng"), entry.get("errors"), entry.get("factors")
    if not (isinstance(entry.get("rank"), int) and entry["rank"] >= 1):
        return "a PowerSGD state without a rank"
    if not _rng_state_is_valid(rng):
        return "a PowerSGD state with a malformed random generator state"
    if errors is not None and not (_finite_floats(errors) and errors.dim() == 2):
        return "a PowerSGD error feedback that is not finite rows of numbers"
    if factors is not None and not (
        isinstance(factors, dict)
        and all(isinstance(q, torch.Tensor) and _finite_floats(q) for q in factors.values())
    ):
        return "PowerSGD factors that are not finite tensors"
    return None


def _rng_state_is_valid(rng: object) -> bool:
    if not isinstance(rng, dict):
        return False
    keys = rng.get("keys")
    return (
        isinstance(keys, torch.Tensor)
        and keys.shape == (RNG_KEYS,)
        and keys.dtype == torch.int64
        and bool(((keys >= 0) & (keys < 2**32)).all())
        and isinstance(rng.get("position"), int)
        and 0 <= rng["position"] <= RNG_KEYS
        and rng.get("has_gauss") in (0, 1)
        and isinstance(rng.get("cached_gaussian"), float)
        and math.isfinite(rng["cached_gaussian"])
    )


def _finite_floats(tensor: object) -> bool:
    return (
        isinstance(tensor, torch.Tensor)
        and tensor.dtype == torch.float32
        and bool(torch.isfinite(tensor).all())
    )


def restore(
    compression: GradCompression,
    state: dict,
    iteration: int,
    placement: Placement,
    model: torch.nn.Module,
    config: Config,
) -> None:
    """Take up the checkpoint's compression state, on every process, at `iteration` (the run's
    next step). What cannot be carried over is dropped with a warning: state of another mode,
    error feedback of another number of processes, factors of another --powersgd_rank."""
    entry = state.get("grad_compression") or {"mode": NONE}  # earlier checkpoints: none
    warn = log.warning if placement.is_main else log.debug
    if entry["mode"] != compression.mode:
        warn(
            "Checkpoint %s was made with --grad_compression %s, this run uses %s%s",
            state["path"],
            entry["mode"],
            compression.mode,
            ": its PowerSGD state (error feedback, factors) is dropped"
            if entry["mode"] == POWERSGD
            else "",
        )
    powersgd = compression.powersgd
    if powersgd is None:
        return
    check_fits(state, model, config)
    powersgd.state.iter = iteration  # PowerSGD's count of steps is the run's
    if entry["mode"] != POWERSGD:
        return
    errors, factors = entry["errors"], entry["factors"]
    if errors is not None and errors.shape[0] != placement.world_size:
        warn(
            "Checkpoint %s holds the PowerSGD error feedback of %d processes, this run has %d: "
            "it cannot be shared out, and starts again from zero (the factors carry on)",
            state["path"],
            errors.shape[0],
            placement.world_size,
        )
        errors = None
    if factors is not None and entry["rank"] != compression.rank:
        warn(
            "--powersgd_rank %d differs from the checkpoint's %d: PowerSGD's factors start "
            "again from random ones (the error feedback carries on)",
            compression.rank,
            entry["rank"],
        )
        factors = None
    powersgd.set_rng_state(entry["rng"])
    powersgd.load(
        {} if errors is None else _by_parameter(errors[placement.rank], powersgd), factors
    )


def _by_parameter(row: torch.Tensor, powersgd: ResumablePowerSGD) -> dict[str, torch.Tensor]:
    pieces, start = {}, 0
    for name, shape in powersgd.shapes.items():
        length = math.prod(shape)
        pieces[name] = row[start : start + length].view(shape)
        start += length
    return pieces


def check_fits(state: dict, model: torch.nn.Module, config: Config) -> None:
    """The checkpoint's PowerSGD state fits this model, if this run takes it up: error feedback as
    long as the model's parameters, one row per process of the checkpoint's run; Q factors of the
    shapes this model's compressed gradients take at --powersgd_rank. Shapes only: a model on
    the meta device serves."""
    entry = state.get("grad_compression") or {"mode": NONE}
    if entry["mode"] != POWERSGD or config.grad_compression != POWERSGD:
        return
    shapes = {name: tuple(parameter.shape) for name, parameter in model.named_parameters()}
    length = sum(math.prod(shape) for shape in shapes.values())
    errors, problem = entry["errors"], None
    if errors is not None and errors.shape != (state["world_size"], length):
        problem = (
            f"PowerSGD error feedback of shape {tuple(errors.shape)}, not "
            f"({state['world_size']}, {length})"
        )
    if entry["factors"] is not None and entry["rank"] == config.powersgd_rank:
        expected = {
            name: (m, r)
            for name, (_, m, r) in zip(shapes, factor_shapes(list(shapes.values()), entry["rank"]))
            if r
        }
        if {name: tuple(q.shape) for name, q in entry["factors"].items()} != expected:
            problem = f"PowerSGD factors that do not fit this model at rank {entry['rank']}"
    if problem:
        raise UserError(
            f"checkpoint {state['path']} has {problem}: give a checkpoint of this model, or "
            "resume with --grad_compression none"
        )
