"""Whether tensors are still finite, read with one reduction per device (a model-parallel
replica spans two) rather than one per tensor."""

from __future__ import annotations

import math

import torch


def finite_by_device(
    tensors: list[torch.Tensor], ord: float
) -> list[tuple[list[int], torch.Tensor]]:
    """Per device: the indices (into `tensors`) of its tensors, and on that device whether each
    one's `ord`-norm is finite. The max-abs norm (inf) is finite exactly when the tensor is; the
    2-norm also overflows for finite values whose squares do not fit the dtype."""
    by_device: dict[torch.device, list[int]] = {}
    for index, tensor in enumerate(tensors):
        by_device.setdefault(tensor.device, []).append(index)
    return [
        (
            indices,
            torch.stack(torch._foreach_norm([tensors[i] for i in indices], ord=ord)).isfinite(),
        )
        for indices in by_device.values()
    ]


def non_finite_tensors(tensors: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors holding a NaN or an infinity, in their order; one copy
    to the host per device."""
    named = [(name, tensor) for name, tensor in tensors.items() if tensor.is_floating_point()]
    bad: set[str] = set()
    for indices, finite in finite_by_device([tensor for _, tensor in named], math.inf):
        bad.update(named[index][0] for index, ok in zip(indices, finite.tolist()) if not ok)
    return [name for name in tensors if name in bad]
