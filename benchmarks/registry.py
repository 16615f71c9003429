"""What a benchmark is: the figures it declares (name, unit, which way is better, goal, noise band)
and the function that measures them once in a tree. Benchmarks register themselves with
`@benchmark(...)` where they are defined; `registered()` imports every module of this package
that holds one (found by its source: a new module needs no list).

Torch-free and trainer-free: the runner that reads these declarations imports neither; only the
measuring processes do (benchmarks/trees.py)."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from benchmarks.trees import Tree

HIGHER: Literal["higher"] = "higher"
LOWER: Literal["lower"] = "lower"

PACKAGE = Path(__file__).resolve().parent
DECLARES = "\n@benchmark("  # how a module that declares a benchmark reads


@dataclass(frozen=True)
class Figure:
    """One figure the docs quote. `noise`: the relative band within which two measurements of
    the same code on this kind of machine are taken as equal; `floor`: the same band in the
    figure's unit, for figures near zero (the band is the larger of the two)."""

    name: str
    unit: str
    better: Literal["higher", "lower"]
    goal: float | None
    noise: float
    doc: str
    floor: float = 0.0
    quick: bool = False

    def band(self, base: float) -> float:
        return max(self.noise * abs(base), self.floor)

    def met(self, value: float) -> bool | None:
        """Whether `value` reaches the goal (None: no goal, or nothing measured)."""
        if self.goal is None or not math.isfinite(value):
            return None
        return value >= self.goal if self.better == HIGHER else value <= self.goal

    def verdict(self, base: float, value: float) -> str:
        """ "worse", "better" or "same": `value` against `base` beyond the noise band."""
        change = value - base if self.better == HIGHER else base - value
        if not (math.isfinite(base) and math.isfinite(value)):
            return "worse" if math.isfinite(base) else "same"
        if change < -self.band(base):
            return "worse"
        return "better" if change > self.band(base) else "same"


class Context(Protocol):
    """What a measurement is given besides its tree (benchmarks/runner.py's Session)."""

    @property
    def data(self) -> Path: ...  # generated inputs, kept between runs

    @property
    def scratch(self) -> Path: ...  # this run's temporary files

    @property
    def quick(self) -> bool: ...


# Measures its figures once in a tree: {figure name: value}; the figures it skips are absent.
Measure = Callable[[Context, Tree], dict[str, float]]
# Makes the inputs the measurements read (once a run, before the first round, not timed).
Prepare = Callable[[Context], None]


@dataclass(frozen=True)
class Benchmark:
    name: str
    title: str  # the heading of its table in BENCHMARKS.md
    figures: tuple[Figure, ...]
    measure: Measure
    prepare: Prepare | None = None
    unavailable: Callable[[], str | None] = lambda: None  # why it cannot run here, or None
    rounds: tuple[int, int] = (3, 5)  # interleaved rounds: (--quick, full)
    order: int = 100  # where its table stands (registry.benchmark)

    def runs_in(self, quick: bool) -> bool:
        return not quick or any(figure.quick for figure in self.figures)


_REGISTRY: dict[str, Benchmark] = {}


def benchmark(
    name: str,
    title: str,
    figures: tuple[Figure, ...],
    prepare: Prepare | None = None,
    unavailable: Callable[[], str | None] | None = None,
    rounds: tuple[int, int] = (3, 5),
    order: int = 100,
) -> Callable[[Measure], Measure]:
    """Registers the decorated function as benchmark `name`, measuring `figures`; `order`: where
    its table stands among the others (lower first; a module's in the order it defines them)."""

    def register(measure: Measure) -> Measure:
        taken = {figure.name for registered in _REGISTRY.values() for figure in registered.figures}
        clash = taken & {figure.name for figure in figures}
        if name in _REGISTRY or clash:
            raise ValueError(f"benchmark {name} declares a name already taken: {clash or name}")
        _REGISTRY[name] = Benchmark(
            name, title, figures, measure, prepare, unavailable or (lambda: None), rounds, order
        )
        return measure

    return register


def registered() -> dict[str, Benchmark]:
    """Every benchmark, in the order their tables stand."""
    for path in sorted(PACKAGE.glob("*.py")):
        if DECLARES in path.read_text():
            importlib.import_module(f"{PACKAGE.name}.{path.stem}")
    return dict(sorted(_REGISTRY.items(), key=lambda item: item[1].order))  # ties: as defined


def all_figures() -> dict[str, Figure]:
    return {figure.name: figure for bench in registered().values() for figure in bench.figures}
