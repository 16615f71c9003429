"""Where a profile's steps spent their time, read from the Chrome trace torch.profiler exports.

On a GPU: the share of the steps' time its kernels and copies kept it busy, and its idle time split
by cause. An idle stretch ends with the activity that came next; the host call that launched it
(the trace's correlation ids pair them) says whether it was queued in time (then the gap is the
GPU's own, between queued kernels) or late, and then what its launching thread was doing from the
moment the GPU went idle until the launch: waiting for a batch, copying or decoding one, a sync,
the optimizer, or else host overhead (Python and launches slower than the kernels they queue).
The kernels are grouped by what launched them, by backend and by precision (trace_kernels.py).
On the CPU, the training thread's time by the same causes.

Torch-free: the trace's JSON in, a one-line summary and a markdown table out (table()).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from resnet50_trainer.reporting.trace_host import (
    FORWARD_BACKWARD,
    HOST_OVERHEAD,
    Launch,
    Span,
    by_cause,
    extent,
    host_threads,
    is_step,
    launch_of,
    nested,
    training_thread,
    union,
)
from resnet50_trainer.reporting.trace_kernels import KernelGroup, kernel_groups

GPU_ACTIVITY = ("kernel", "gpu_memcpy", "gpu_memset")
LONG_GAPS = 8  # the longest idle stretches the table names one by one
BETWEEN_KERNELS = "between queued kernels"


@dataclass(frozen=True)
class Gap:
    at: float  # microseconds into the GPU's window
    idle: float
    cause: str
    host_call: str  # what the launching thread was busy with as the GPU waited


@dataclass
class TraceReport:
    steps: int
    host_window: float  # microseconds: the recorded steps on the training thread
    host_causes: dict[str, float]  # the training thread's time by cause
    device: str | None = None  # the GPU read, where the trace has one
    gpu_window: float = 0.0  # first to last activity on it
    busy: float = 0.0
    idle: dict[str, float] = field(default_factory=dict)
    gaps: list[Gap] = field(default_factory=list)
    kernels: list[KernelGroup] = field(default_factory=list)

    def line(self) -> str:
        """The one-line summary the run logs."""
        steps = f"{self.steps} step{'s' * (self.steps != 1)}"
        if self.device is None:
            window = self.host_window
            shares = _shares(self.host_causes, window)
            return (
                f"{steps}, {window / max(self.steps, 1) / 1e3:.1f} ms a step on the CPU: {shares}"
            )
        window = self.gpu_window
        idle = window - self.busy
        return (
            f"{steps}, {window / max(self.steps, 1) / 1e3:.1f} ms a step: the GPU "
            f"was busy {self.busy / window:.0%} of the time, idle {idle / window:.0%}"
            + (f" ({_shares(self.idle, window)})" if idle > 0 else "")
        )

    def table(self, title: str) -> str:
        """Markdown: the summary, the time by cause, the kernels by kind, the longest gaps."""
        steps = max(self.steps, 1)
        lines = [f"# {title}", "", self.line() + ".", ""]
        if self.device is None:
            lines += _table(
                ("the training thread's time", "ms a step", "share"),
                ("{}", MS, SHARE),
                [
                    (cause, t / steps, t / self.host_window)
                    for cause, t in _ranked(self.host_causes)
                ],
            )
            return "\n".join(lines) + "\n"
        window = self.gpu_window
        lines += _table(
            (f"{self.device}, from its first activity to its last", "ms a step", "share"),
            ("{}", MS, SHARE),
            [("busy (kernels, copies)", self.busy / steps, self.busy / window)]
            + [(f"idle: {cause}", t / steps, t / window) for cause, t in _ranked(self.idle)],
        )
        lines += [
            "",
            "Its kernels by what launched them (precision as their names say; kernels of several "
            "streams at once make the shares add past 100%):",
            "",
        ]
        lines += _table(
            ("kind", "backend", "precision", "kernels a step", "ms a step", "share of busy"),
            ("{}", "{}", "{}", "{:.0f}", MS, SHARE),
            [
                (
                    group.kind,
                    group.backend,
                    group.precision,
                    group.count / steps,
                    group.time / steps,
                    group.time / max(self.busy, 1e-9),
                )
                for group in self.kernels
            ],
        )
        if self.gaps:
            lines += ["", f"Its {len(self.gaps)} longest idle stretches:", ""]
            lines += _table(
                ("at (ms into the window)", "idle (µs)", "cause", "the launching thread was in"),
                (MS, "{:.0f}", "{}", "{}"),
                [(gap.at, gap.idle, gap.cause, gap.host_call) for gap in self.gaps],
            )
        return "\n".join(lines) + "\n"


MS = "{:.2f}"  # of a value in microseconds: written in milliseconds (_table)
SHARE = "{:.1%}"


def _ranked(times: dict[str, float]) -> list[tuple[str, float]]:
    return sorted(times.items(), key=lambda item: -item[1])


def _shares(times: dict[str, float], window: float) -> str:
    shown = [f"{cause} {t / window:.0%}" for cause, t in _ranked(times) if t / window >= 0.005]
    return ", ".join(shown) or "nothing to name"


def _table(
    header: Sequence[str], formats: Sequence[str], rows: Iterable[Sequence[object]]
) -> list[str]:
    """Markdown rows; a column formatted MS holds microseconds, shown as milliseconds."""

    def cell(value: object, form: str) -> str:
        if form is MS and isinstance(value, float):
            value = value / 1e3
        return form.format(value).replace("|", "\\|")

    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(map(cell, row, formats)) + " |" for row in rows]
    return out


def read_trace(trace: dict) -> TraceReport:
    """The report of a trace as torch.profiler exports it (its "traceEvents")."""
    events = [event for event in trace.get("traceEvents", ()) if event.get("ph") == "X"]
    threads = host_threads(events)
    launches, causes = nested(threads)
    steps = [span for spans in threads.values() for span in spans if is_step(span.name)]
    training = training_thread(threads)
    window = union([(span.start, span.end) for span in steps]) or extent(threads.get(training))
    host_time = sum(end - start for start, end in window)
    report = TraceReport(
        steps=len(steps) or 1,
        host_window=host_time,
        host_causes=by_cause(window, causes.get(training, {}), FORWARD_BACKWARD),
    )
    activity = [event for event in events if event.get("cat") in GPU_ACTIVITY]
    if activity:
        bounds = (window[0][0], window[-1][1]) if steps else None
        _read_gpu(report, activity, bounds, launches, causes, threads, training)
    return report


def _read_gpu(
    report: TraceReport,
    activity: list[dict],
    bounds: tuple[float, float] | None,
    launches: dict[int, Launch],
    causes: dict[tuple[int, int], dict[str, list[tuple[float, float]]]],
    threads: dict[tuple[int, int], list[Span]],
    training: tuple[int, int],
) -> None:
    """The busiest GPU over the recorded steps (`bounds`; without steps in the trace, its first
    activity to its last): busy time, idle time by cause, longest gaps and kernel groups."""
    by_device: dict[object, list[dict]] = defaultdict(list)
    for event in activity:
        by_device[event.get("args", {}).get("device", event.get("pid"))].append(event)
    device, events = max(by_device.items(), key=lambda item: sum(e["dur"] for e in item[1]))
    events.sort(key=lambda event: event["ts"])
    first, last = bounds or (events[0]["ts"], max(e["ts"] + e["dur"] for e in events))
    busy: list[tuple[float, float]] = []
    # Idle from, to, and the launch of what ended it (None: the steps' end).
    gaps: list[tuple[float, float, Launch | None]] = []
    for event in events:
        start = max(float(event["ts"]), first)
        end = min(float(event["ts"]) + float(event["dur"]), last)
        if end <= start:
            continue  # outside the recorded steps
        if busy and start <= busy[-1][1]:
            busy[-1] = (busy[-1][0], max(busy[-1][1], end))
            continue
        idle_from = busy[-1][1] if busy else first
        if start > idle_from:
            gaps.append((idle_from, start, launch_of(event, launches)))
        busy.append((start, end))
    if busy and busy[-1][1] < last:
        gaps.append((busy[-1][1], last, None))
    report.device = f"GPU {device}"
    report.gpu_window = last - first
    report.busy = sum(end - start for start, end in busy)
    idle: dict[str, float] = defaultdict(float)
    named = []
    for start, end, launch in gaps:
        split = _idle_causes(start, end, launch, causes, training)
        for cause, time in split.items():
            idle[cause] += time
        named.append((end - start, start, max(split, key=split.__getitem__), launch))
    report.idle = dict(idle)
    report.gaps = [
        Gap(at - first, length, cause, _busy_with(threads, launch, at))
        for length, at, cause, launch in sorted(named, key=lambda gap: -gap[0])[:LONG_GAPS]
    ]
    report.kernels = kernel_groups(events, launches)


def _idle_causes(
    start: float,
    end: float,
    launch: Launch | None,
    causes: dict[tuple[int, int], dict[str, list[tuple[float, float]]]],
    training: tuple[int, int],
) -> dict[str, float]:
    """An idle stretch by cause: the GPU's own where what ended it was queued before it began;
    else what its launching thread did until the launch, and the launch's own latency after.
    After the last activity (no launch ends it), what the training thread did."""
    if launch is None:
        return by_cause([(start, end)], causes.get(training, {}), HOST_OVERHEAD)
    if launch.start <= start:
        return {BETWEEN_KERNELS: end - start}
    late_until = min(launch.start, end)
    split = by_cause([(start, late_until)], causes.get(launch.thread, {}), HOST_OVERHEAD)
    split[HOST_OVERHEAD] = split.get(HOST_OVERHEAD, 0.0) + end - late_until
    return {cause: time for cause, time in split.items() if time > 0}


def _busy_with(
    threads: dict[tuple[int, int], list[Span]], launch: Launch | None, idle_from: float
) -> str:
    """What the launching thread was doing while the GPU waited for its launch: the innermost of
    its spans that covers most of that time; for work queued in time, the call that queued it."""
    if launch is None:
        return "(the steps' end)"
    if launch.start <= idle_from:
        return f"queued in time by {launch.ancestors[-1] if launch.ancestors else 'the host'}"
    length = launch.start - idle_from
    spans = [
        (min(span.end, launch.start) - max(span.start, idle_from), span)
        for span in threads.get(launch.thread, ())
        if span.start < launch.start and span.end > idle_from
    ]
    mostly = [span for covered, span in spans if covered >= length / 2]
    if mostly:
        return min(mostly, key=lambda span: span.end - span.start).name
    return max(spans, key=lambda pair: pair[0])[1].name if spans else "(no recorded call)"
