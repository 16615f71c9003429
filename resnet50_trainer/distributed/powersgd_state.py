"""PowerSGD (Vogels et al. 2019) through torch's DDP communication hook, with a state that
outlives its DDP, so that a resumed run continues as the uninterrupted one would have.

torch's powerSGD_hook keeps its state per DDP bucket index: this process's error feedback (what
compression left out, as long as the bucket) and the factors P and Q of warm start. DDP's buckets
are not fixed: a new DDP puts every gradient in one bucket for its first step and rebuilds them
after it, in the order the gradients became ready. So whenever the buckets change (and when a
checkpoint is restored) the state is parked per parameter name, and cut into each bucket's
tensors at that bucket's first hook call in the new layout. The hook's arithmetic is per
parameter (the all-reduces add element by element), so a resumed run's first step, with its one
bucket, computes what the uninterrupted run did with its rebuilt ones."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import (
    PowerSGDState,
    _should_compress,
    powerSGD_hook,
)

# torch's default: a matrix is compressed only if its factors are at most half its size.
MIN_COMPRESSION_RATE = 2
RNG_KEYS = 624  # numpy's MT19937 state words


@dataclass(frozen=True)
class Piece:
    """One parameter's part of a flat bucket tensor: where it starts and its shape there."""

    name: str
    start: int
    shape: tuple[int, ...]

    @property
    def length(self) -> int:
        return int(np.prod(self.shape))


@dataclass(frozen=True)
class BucketLayout:
    names: tuple[str, ...]
    gradients: tuple[Piece, ...]  # each gradient in the bucket's buffer (and error feedback)
    factors: tuple[Piece, ...]  # each compressed gradient's Q in the bucket's Q memory
    p_length: int


def factor_shapes(shapes: Sequence[tuple[int, ...]], rank: int) -> list[tuple[int, int, int]]:
    """(n, m, r) of each gradient the hook compresses, by position; (0, 0, 0) for the others:
    it views a gradient as n x m (n its first dimension) and approximates it at rank r."""
    factors = []
    for shape in shapes:
        n = shape[0]
        m = int(np.prod(shape)) // n if n else 0
        r = min(n, m, rank)
        compress = r > 0 and _should_compress(n, m, r, MIN_COMPRESSION_RATE)[0]
        factors.append((n, m, r) if compress else (0, 0, 0))
    return factors


def bucket_layout(bucket: dist.GradBucket, names: tuple[str, ...], rank: int) -> BucketLayout:
    """Where each parameter's state lies in this bucket's tensors, as powerSGD_hook places it:
    the gradients where DDP put them, the Q factors grouped by matrix shape in order of first
    appearance (the hook's own order)."""
    buffer, gradients = bucket.buffer(), bucket.gradients()
    pieces = tuple(
        Piece(name, (gradient.data_ptr() - buffer.data_ptr()) // buffer.element_size(), shape)
        for name, gradient, shape in zip(names, gradients, (tuple(g.shape) for g in gradients))
    )
    by_shape: dict[tuple[int, int], list[tuple[str, int, int]]] = defaultdict(list)
    shapes = [piece.shape for piece in pieces]
    for name, (n, m, r) in zip(names, factor_shapes(shapes, rank)):
        if r:
            by_shape[(n, m)].append((name, m, r))
    factors, q_start, p_length = [], 0, 0
    for (n, _), group in by_shape.items():
        for name, m, r in group:
            factors.append(Piece(name, q_start, (m, r)))
            q_start, p_length = q_start + m * r, p_length + n * r
    return BucketLayout(names, pieces, tuple(factors), p_length)


class ResumablePowerSGD:
    """torch's PowerSGD state, with its per-bucket tensors parked by parameter name between
    bucket layouts (see the module's doc)."""

    def __init__(
        self,
        model: torch.nn.Module,
        rank: int,
        start_iteration: int,
        seed: int,
        wait_each_bucket: bool,
    ):
        self.state = PowerSGDState(
            process_group=None,
            matrix_approximation_rank=rank,
            start_powerSGD_iter=start_iteration,
            min_compression_rate=MIN_COMPRESSION_RATE,
            random_seed=seed % 2**32,  # the same on every process: Q starts the same everywhere
        )
        self.names = {id(parameter): name for name, parameter in model.named_parameters()}
        # The checkpoint's order of parameters (the model's), and their shapes.
        self.shapes = {name: tuple(parameter.shape) for name, parameter in model.named_parameters()}
        self.layouts: dict[int, BucketLayout] = {}
        self.placed: set[str] = set()  # parameters whose state is in a bucket of `layouts`
        self.parked_errors: dict[str, torch.Tensor] = {}
        self.parked_factors: dict[str, torch.Tensor] = {}
        self.parked_warm = False  # Q factors are parked: warm start, no fresh random Q
        self.wait_each_bucket = wait_each_bucket

    def hook(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        self._follow_layout(bucket)
        future = powerSGD_hook(self.state, bucket)
        if self.wait_each_bucket:
            # The hook starts its second and third all-reduce from the first's callbacks, which
            # Gloo runs on its own threads: with several buckets in flight, processes would
            # start them in different orders (Gloo aborts on the mismatch). One bucket at a time.
            future.wait()
        return future

    def _follow_layout(self, bucket: dist.GradBucket) -> None:
        index = bucket.index()
        names = tuple(self.names[id(parameter)] for parameter in bucket.parameters())
        known = self.layouts.get(index)
        if known is not None and known.names == names:
            return
        if known is not None or self.placed.intersection(names):  # DDP rebuilt its buckets
            self._park()
        layout = bucket_layout(bucket, names, self.state.matrix_approximation_rank)
        self.layouts[index] = layout
        self.placed.update(names)
        self._unpark(index, layout, bucket.buffer())

    def _park(self) -> None:
        """Every bucket's state, by parameter; the buckets are forgotten."""
        state = self.state
        for index, layout in self.layouts.items():
            error = state.error_dict.pop(index, None)
            if error is not None:
                self.parked_errors.update(_cut(error, layout.gradients))
            state.p_memory_dict.pop(index, None)
            factors = state.q_memory_dict.pop(index, None)
            if factors is not None:
                self.parked_factors.update(_cut(factors, layout.factors))
                self.parked_warm = True
        self.layouts.clear()
        self.placed.clear()

    def _unpark(self, index: int, layout: BucketLayout, buffer: torch.Tensor) -> None:
        """The parked state of this bucket's parameters, into the hook's tensors for it."""
        state = self.state
        if any(piece.name in self.parked_errors for piece in layout.gradients):
            error = torch.zeros_like(buffer)
            for piece in layout.gradients:
                part = self.parked_errors.pop(piece.name, None)
                if part is not None:
                    error[piece.start : piece.start + piece.length] = part.reshape(-1)
            state.error_dict[index] = error
        if self.parked_warm and all(piece.name in self.parked_factors for piece in layout.factors):
            q_memory = buffer.new_empty(sum(piece.length for piece in layout.factors))
            for piece in layout.factors:
                part = self.parked_factors.pop(piece.name)
                q_memory[piece.start : piece.start + piece.length] = part.reshape(-1)
            state.q_memory_dict[index] = q_memory
            state.p_memory_dict[index] = buffer.new_empty(layout.p_length)

    def errors(self) -> dict[str, torch.Tensor]:
        """This process's error feedback by parameter (views; empty before compression began)."""
        errors = dict(self.parked_errors)
        for index, layout in self.layouts.items():
            if index in self.state.error_dict:
                errors.update(_cut(self.state.error_dict[index], layout.gradients))
        return errors

    def factors(self) -> dict[str, torch.Tensor] | None:
        """The Q factors by parameter (the same on every process), or None before warm start."""
        factors, warm = dict(self.parked_factors), self.parked_warm
        for index, layout in self.layouts.items():
            if index in self.state.q_memory_dict:
                factors.update(_cut(self.state.q_memory_dict[index], layout.factors))
                warm = True
        return factors if warm else None

    def load(
        self, errors: dict[str, torch.Tensor], factors: dict[str, torch.Tensor] | None
    ) -> None:
        """Park a checkpoint's state: each bucket takes its part at its next hook call."""
        self.state.error_dict.clear()
        self.state.p_memory_dict.clear()
        self.state.q_memory_dict.clear()
        self.layouts.clear()
        self.placed.clear()
        self.parked_errors = dict(errors)
        self.parked_factors = dict(factors or {})
        self.parked_warm = factors is not None

    def rng_state(self) -> dict:
        """The generator that draws fresh Q factors, as tensors and numbers (weights_only)."""
        state = self.state.rng.get_state(legacy=False)
        return {
            "keys": torch.from_numpy(state["state"]["key"].astype(np.int64)),
            "position": int(state["state"]["pos"]),
            "has_gauss": int(state["has_gauss"]),
            "cached_gaussian": float(state["gauss"]),
        }

    def set_rng_state(self, saved: dict) -> None:
        self.state.rng.set_state(
            {
                "bit_generator": "MT19937",
                "state": {"key": saved["keys"].numpy().astype(np.uint32), "pos": saved["position"]},
                "has_gauss": saved["has_gauss"],
                "gauss": saved["cached_gaussian"],
            }
        )


def _cut(flat: torch.Tensor, pieces: Sequence[Piece]) -> dict[str, torch.Tensor]:
    return {
        piece.name: flat[piece.start : piece.start + piece.length].view(piece.shape)
        for piece in pieces
    }


# DDP checks a hook's annotations against the classes themselves, and this module's annotations
# are strings (`from __future__ import annotations`).
ResumablePowerSGD.hook.__annotations__.update(
    {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
)
