"""Measuring: the benchmarks' rounds over one tree (`run`) or two (`compare`), interleaved, and the
figures' records (the JSON that `tables` reads)."""

from __future__ import annotations

import datetime
import math
import os
import platform
import shutil
import statistics
import subprocess
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.errors import BenchmarkUsageError
from benchmarks.registry import Benchmark, Figure, registered
from benchmarks.trees import MeasurementFailed, Tree


@dataclass(frozen=True)
class Session:
    data: Path  # generated inputs, kept between runs (they take minutes to make)
    scratch: Path  # this run's temporary files
    quick: bool


Samples = dict[str, list[float]]  # figure name -> one value a round


def select(only: Sequence[str], quick: bool) -> dict[Benchmark, list[Figure]]:
    """The benchmarks to run and the figures of each to keep: those of `--quick` (or all), or
    those that `only` names (a figure's name or a benchmark's, for all its figures)."""
    benchmarks = registered()
    known = set(benchmarks) | {
        figure.name for bench in benchmarks.values() for figure in bench.figures
    }
    unknown = [name for name in only if name not in known]
    if unknown:
        raise BenchmarkUsageError(
            f"--only {' '.join(unknown)}: no such figure or benchmark; "
            "`python -m benchmarks list` names them"
        )
    chosen = {}
    for bench in benchmarks.values():
        figures = [
            figure
            for figure in bench.figures
            if (figure.name in only or bench.name in only)
            or (not only and (figure.quick or not quick))
        ]
        if figures:
            chosen[bench] = figures
    return chosen


def measure(
    chosen: dict[Benchmark, list[Figure]],
    trees: Sequence[Tree],
    session: Session,
    say: Callable[[str], None],
) -> tuple[dict[str, Samples], dict[str, str]]:
    """Samples of every chosen figure in every tree, and what failed ({where: why}). Rounds are
    interleaved: each benchmark measures each tree once a round, the trees' order reversed every
    other round, so that a machine's drift (other work, heat) falls on both alike."""
    samples: dict[str, Samples] = {tree.name: {} for tree in trees}
    failures: dict[str, str] = {}
    runnable = []
    for bench in chosen:
        reason = bench.unavailable()
        if reason:
            failures[bench.name] = f"skipped: {reason}"
            say(f"{bench.name}: skipped ({reason})")
            continue
        if bench.prepare is not None:
            say(f"{bench.name}: preparing its inputs in {session.data}")
            try:
                bench.prepare(session)
            except (MeasurementFailed, subprocess.CalledProcessError, OSError) as failure:
                failures[bench.name] = f"its inputs could not be made: {failure}"
                say(f"{bench.name}: FAILED to make its inputs: {failure}")
                continue
        runnable.append(bench)
    rounds = {bench: bench.rounds[0 if session.quick else 1] for bench in runnable}
    for round_index in range(max(rounds.values(), default=0)):
        order = list(trees) if round_index % 2 == 0 else list(reversed(trees))
        say(f"round {round_index + 1} (load {os.getloadavg()[0]:.1f})")
        for bench in runnable:
            if round_index >= rounds[bench]:
                continue
            wanted = {figure.name for figure in chosen[bench]}
            for tree in order:
                where = f"{bench.name} in {tree.name}"
                if where in failures:
                    continue
                started = time.monotonic()
                try:
                    values = bench.measure(session, tree)
                except MeasurementFailed as failure:
                    failures[where] = str(failure)
                    say(f"  {where}: FAILED\n{failure}")
                    continue
                except Exception as bug:  # a benchmark's own: its figures are lost, not the run's
                    say(f"  {where}: FAILED\n{traceback.format_exc()}")
                    failures[where] = f"{type(bug).__name__}: {bug} (traceback above)"
                    continue
                for name, value in values.items():
                    if name in wanted:
                        samples[tree.name].setdefault(name, []).append(value)
                shown = ", ".join(f"{name} {value:.4g}" for name, value in values.items())
                say(f"  {where} ({time.monotonic() - started:.0f} s): {shown}")
    return samples, failures


def median(values: Sequence[float]) -> float:
    finite = [value for value in values if math.isfinite(value)]
    return statistics.median(finite) if finite else math.nan


def machine() -> str:
    """This machine in words: CPU model and cores, memory, GPUs (nvidia-smi's names)."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            names = [
                line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")
            ]
        model = names[0] if names else model
    except OSError:
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    gpus = "no GPU"
    if shutil.which("nvidia-smi"):
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
        names = [
            line.split(":", 1)[1].split("(")[0].strip()
            for line in listed.splitlines()
            if ":" in line
        ]
        gpus = ", ".join(names) or gpus
    return f"{os.cpu_count()} cores ({model}), {memory:.0f} GiB, {gpus}"


def records(
    chosen: dict[Benchmark, list[Figure]], samples: Samples, tree: Tree
) -> list[dict[str, object]]:
    """The figures measured in `tree`, one record each: the JSON `run` writes and `tables` reads."""
    context = {
        "machine": machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": tree.commit(),
        "load": round(os.getloadavg()[0], 1),  # the machine's 1-minute load as the run ended
    }
    out: list[dict[str, object]] = []
    for bench, figures in chosen.items():
        for figure in figures:
            if figure.name not in samples:
                continue
            value = median(samples[figure.name])
            out.append(
                {
                    "name": figure.name,
                    "value": value,
                    "unit": figure.unit,
                    "goal": figure.goal,
                    "better": figure.better,
                    "met": figure.met(value),
                    "noise": figure.noise,
                    "samples": samples[figure.name],
                    "benchmark": bench.name,
                    **context,
                }
            )
    return out


def compared(
    chosen: dict[Benchmark, list[Figure]], this: Samples, base: Samples
) -> list[tuple[Figure, float, float, str]]:
    """(figure, base median, this median, verdict) of each figure measured in both trees. The
    verdict is on the median of the rounds' differences (this tree's value minus the base's of the
    same round): a round's load falls on both trees alike, so pairing takes it out."""
    rows = []
    for figures in chosen.values():
        for figure in figures:
            if figure.name in this and figure.name in base:
                before, after = median(base[figure.name]), median(this[figure.name])
                pairs = zip(this[figure.name], base[figure.name])
                change = median([mine - theirs for mine, theirs in pairs])
                rows.append((figure, before, after, figure.verdict(before, before + change)))
    return rows
