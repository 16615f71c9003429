"""A GPU's kernels and copies in a profile's trace, grouped by what launched them (convolution,
batch norm, optimizer, input, communication, other), by backend (cuDNN, cuBLAS, NCCL or PyTorch's
own kernels) and by the precision their names carry. Torch-free, as is trace_report.py, which
reports them."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass

from resnet50_trainer.data.spans import (
    CHECKPOINT,
    COPY_TO_DEVICE,
    DECODE_ON_GPU,
    EVALUATION,
    WAIT_FOR_BATCH,
)
from resnet50_trainer.reporting.trace_host import Launch, launch_of


@dataclass(frozen=True)
class KernelGroup:
    kind: str
    backend: str
    precision: str
    count: int
    time: float  # microseconds, all steps together


_PRECISIONS = (
    ("bfloat16", re.compile(r"bf16|bfloat16", re.IGNORECASE)),
    ("float16", re.compile(r"f16|half", re.IGNORECASE)),
    ("tf32", re.compile(r"tf32", re.IGNORECASE)),
    ("float32", re.compile(r"f32|float", re.IGNORECASE)),
)


def kernel_groups(events: list[dict], launches: dict[int, Launch]) -> list[KernelGroup]:
    """The GPU's activities (`events`) by kind, backend and precision, the longest group first."""
    counts: Counter[tuple[str, str, str]] = Counter()
    times: dict[tuple[str, str, str], float] = defaultdict(float)
    for event in events:
        launch = launch_of(event, launches)
        key = _kernel_key(event, launch.ancestors if launch else ())
        counts[key] += 1
        times[key] += float(event["dur"])
    return [
        KernelGroup(*key, counts[key], time)
        for key, time in sorted(times.items(), key=lambda item: -item[1])
    ]


def _kernel_key(event: dict, ancestors: tuple[str, ...]) -> tuple[str, str, str]:
    """(kind, backend, precision) of a GPU activity, from the host spans that launched it."""
    name = event.get("name", "")
    if event.get("cat") != "kernel":
        return (" ".join(name.split()[:2]), "-", "-")  # "Memcpy HtoD", "Memset (Device)"
    lowered = [ancestor.lower() for ancestor in ancestors]
    if EVALUATION in ancestors or CHECKPOINT in ancestors:
        kind = "between steps (evaluation, checkpoints)"
    elif any(ancestor in (WAIT_FOR_BATCH, COPY_TO_DEVICE, DECODE_ON_GPU) for ancestor in ancestors):
        kind = "input"
    elif any(ancestor.startswith("optimizer.") for ancestor in lowered):
        kind = "optimizer"
    elif any("batch_norm" in ancestor for ancestor in lowered):
        kind = "batch norm"
    elif any("conv" in ancestor for ancestor in lowered):
        kind = "convolution"
    else:
        kind = "other"
    text = " ".join([*lowered, name.lower()])
    if name.lower().startswith("nccl"):
        kind = "communication"
    if "cudnn" in text or (kind == "convolution" and ("xmma" in text or "implicit" in text)):
        backend = "cuDNN"
    elif any(word in text for word in ("gemm", "cublas", "nvjet")):
        backend = "cuBLAS"
    elif "nccl" in text:
        backend = "NCCL"
    elif "at::native" in name or name.startswith("void at::"):
        backend = "PyTorch"
    else:
        backend = "other library"
    precision = next((label for label, pattern in _PRECISIONS if pattern.search(name)), "-")
    return kind, backend, precision
