"""The host's side of a profile's trace (the Chrome JSON torch.profiler exports): each thread's
spans, nested; each launch of GPU work with the host spans around it; each thread's spans of each
host cause (waiting for input, a sync, the optimizer, ...); and the interval arithmetic that splits
a stretch of time by cause. Torch-free; reporting/trace_report.py makes the report of it."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from resnet50_trainer.data.spans import (
    CHECKPOINT,
    COPY_TO_DEVICE,
    DECODE_ON_GPU,
    EVALUATION,
    WAIT_FOR_BATCH,
)

HOST_EVENTS = ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver", "python_function")
STEP_PREFIX = "ProfilerStep#"  # torch.profiler's span of each step it records
EVALUATING = "the epoch's evaluation"
SAVING = "saving checkpoints"
WAITING_FOR_INPUT = "waiting for input"
COPYING_INPUT = "copying input to the device"
DECODING_INPUT = "decoding input on the GPU"
COLLECTIVES = "collectives (waiting for the other processes)"
SYNCS = "syncs (the host waiting for the GPU)"
ALLOCATIONS = "memory allocations (cudaMalloc, cudaFree)"
OPTIMIZER = "optimizer (host side)"
HOST_OVERHEAD = "host overhead (Python, launches)"
# The host's activities that can make a launch late, most specific first: a sync inside the
# decoder is the decoder's. Evaluations and checkpoints are work between steps, which a profile
# over an epoch's end (or a --checkpoint_every_iters save) holds: named, not counted as the step's.
HOST_CAUSES = (
    EVALUATING,
    SAVING,
    WAITING_FOR_INPUT,
    COPYING_INPUT,
    DECODING_INPUT,
    COLLECTIVES,
    SYNCS,
    ALLOCATIONS,
    OPTIMIZER,
)
FORWARD_BACKWARD = "forward, backward and the loop"  # the rest of a CPU step


@dataclass(frozen=True)
class Span:
    start: float  # microseconds, the trace's clock
    end: float
    name: str
    correlation: int | None = None  # a launch's, pairing it with the GPU work it queued


@dataclass(frozen=True)
class Launch:
    """A host call that queued GPU work: its thread, when, and the host spans around it."""

    thread: tuple[int, int]
    start: float
    ancestors: tuple[str, ...]  # outermost first


def launch_of(activity: dict, launches: dict[int, Launch]) -> Launch | None:
    """The launch that queued a GPU activity, paired by the trace's correlation id; None where the
    trace holds none (-1: no launch has it)."""
    return launches.get(activity.get("args", {}).get("correlation", -1))


def host_threads(events: Sequence[dict]) -> dict[tuple[int, int], list[Span]]:
    threads: dict[tuple[int, int], list[Span]] = defaultdict(list)
    for event in events:
        if event.get("cat") in HOST_EVENTS:
            start = float(event["ts"])
            span = Span(
                start,
                start + float(event.get("dur", 0)),
                event.get("name", ""),
                event.get("args", {}).get("correlation")
                if event.get("cat") in ("cuda_runtime", "cuda_driver")
                else None,
            )
            threads[(event.get("pid", 0), event.get("tid", 0))].append(span)
    for spans in threads.values():
        spans.sort(key=lambda span: (span.start, -span.end))
    return threads


def nested(
    threads: dict[tuple[int, int], list[Span]],
) -> tuple[dict[int, Launch], dict[tuple[int, int], dict[str, list[tuple[float, float]]]]]:
    """Each launch's host spans around it (by correlation id), and each thread's spans of each
    host cause, merged."""
    launches: dict[int, Launch] = {}
    causes: dict[tuple[int, int], dict[str, list[tuple[float, float]]]] = {}
    for thread, spans in threads.items():
        stack: list[Span] = []
        of_cause: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for span in spans:
            while stack and stack[-1].end <= span.start:
                stack.pop()
            if span.correlation is not None:
                launches[span.correlation] = Launch(
                    thread, span.start, tuple(s.name for s in stack)
                )
            cause = _host_cause(span.name)
            if cause is not None:
                of_cause[cause].append((span.start, span.end))
            stack.append(span)
        causes[thread] = {cause: union(intervals) for cause, intervals in of_cause.items()}
    return launches, causes


def _host_cause(name: str) -> str | None:
    if name == EVALUATION:
        return EVALUATING
    if name == CHECKPOINT:
        return SAVING
    if name == WAIT_FOR_BATCH or name.startswith("enumerate(DataLoader)"):
        return WAITING_FOR_INPUT
    if name == COPY_TO_DEVICE:
        return COPYING_INPUT
    if name == DECODE_ON_GPU:
        return DECODING_INPUT
    if name.startswith(("nccl:", "gloo:", "c10d::")):
        return COLLECTIVES
    if "Synchronize" in name or name in ("cudaMemcpy", "cuMemcpy"):
        return SYNCS
    if name in ("cudaMalloc", "cudaFree", "cudaHostAlloc", "cudaFreeHost", "cuMemAlloc_v2"):
        return ALLOCATIONS  # the caching allocator, which in a steady state should not need them
    if name.startswith(("Optimizer.step#", "Optimizer.zero_grad#")):
        return OPTIMIZER
    return None


def is_step(name: str) -> bool:
    return name.startswith(STEP_PREFIX)


def training_thread(threads: dict[tuple[int, int], list[Span]]) -> tuple[int, int]:
    """The thread that ran the steps (torch.profiler marks them there), else the busiest."""
    for thread, spans in threads.items():
        if any(is_step(span.name) for span in spans):
            return thread
    return max(threads, key=lambda thread: len(threads[thread]), default=(0, 0))


def extent(spans: Sequence[Span] | None) -> list[tuple[float, float]]:
    if not spans:
        return []
    return [(min(span.start for span in spans), max(span.end for span in spans))]


def union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _overlap(intervals: list[tuple[float, float]], start: float, end: float) -> list[tuple]:
    """The parts of merged `intervals` inside [start, end]."""
    first = max(bisect.bisect_right(intervals, (start, float("inf"))) - 1, 0)
    parts = []
    for low, high in intervals[first:]:
        if low >= end:
            break
        if high > start:
            parts.append((max(low, start), min(high, end)))
    return parts


def by_cause(
    pieces: list[tuple[float, float]],
    causes: dict[str, list[tuple[float, float]]],
    rest: str,
) -> dict[str, float]:
    """The time of `pieces` under each host cause, in HOST_CAUSES' order of precedence; what no
    cause covers goes to `rest`."""
    times: dict[str, float] = defaultdict(float)
    for cause in HOST_CAUSES:
        covered = []
        for start, end in pieces:
            covered += _overlap(causes.get(cause, []), start, end)
        times[cause] += sum(end - start for start, end in covered)
        pieces = _minus(pieces, covered)
    times[rest] += sum(end - start for start, end in pieces)
    return {cause: time for cause, time in times.items() if time > 0}


def _minus(
    pieces: list[tuple[float, float]], covered: list[tuple[float, float]]
) -> list[tuple[float, float]]:
    left = []
    for start, end in pieces:
        for low, high in covered:  # sorted, inside the pieces, disjoint
            if high <= start or low >= end:
                continue
            if low > start:
                left.append((start, low))
            start = max(start, high)
        if start < end:
            left.append((start, end))
    return left
