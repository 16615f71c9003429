"""benchmarks/: the figures' declarations, verdicts and goals, the quick set's names, the generated
BENCHMARKS.md and docs/speed.md block kept current, and bad input refused in one line."""

from __future__ import annotations

import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import tables
from benchmarks.errors import BenchmarkUsageError
from benchmarks.output import output_path, replace_file
from benchmarks.registry import DECLARES, HIGHER, LOWER, Figure, all_figures, registered
from benchmarks.runner import compared, records, select
from benchmarks.trees import BENCHMARKS_ROOT, Tree
from tests.support.trainer_runs import REPOSITORY

# The quick set's figures, by the names docs/speed.md defines and the issue asked for.
QUICK = {
    "start_help_s",
    "first_step_1k_s",
    "first_step_1m_extra_s",
    "run_cpu_2p_s",
    "preflight_50k_s",
    "input_rr_vs_decode",
    "input_scale_vs_decode",
    "input_vs_pytorch_example",
    "train_vs_example_loop",
    "step_overhead_vs_bare_loop",
}
RESULTS = os.path.join(REPOSITORY, "benchmarks", "results")


def seconds(**overrides: object) -> Figure:
    fields: dict = dict(name="x_s", unit="s", better=LOWER, goal=3.0, noise=0.1, doc="d", floor=0.5)
    return Figure(**{**fields, **overrides})


def test_a_change_beyond_the_noise_band_is_a_verdict_and_within_it_is_not():
    figure = seconds()
    assert figure.verdict(10.0, 10.9) == "same"  # band: 10% of 10 s
    assert figure.verdict(10.0, 11.2) == "worse"
    assert figure.verdict(10.0, 8.8) == "better"
    assert figure.verdict(1.0, 1.4) == "same"  # the floor, 0.5 s, is the larger band
    assert figure.verdict(1.0, 1.6) == "worse"
    assert figure.verdict(1.0, math.nan) == "worse"  # measured before, failed now
    ratio = seconds(better=HIGHER, unit="x", floor=0.0)
    assert ratio.verdict(1.0, 0.85) == "worse"
    assert ratio.verdict(1.0, 1.15) == "better"


def test_goals_are_met_on_their_side():
    assert seconds().met(3.0) and not seconds().met(3.01)
    assert seconds(better=HIGHER, goal=0.8).met(0.81)
    assert seconds(goal=None).met(1.0) is None
    assert seconds().met(math.nan) is None


def test_the_quick_set_holds_the_named_figures_each_with_a_goal_and_a_band():
    quick = {
        figure.name: figure for figures in select([], quick=True).values() for figure in figures
    }
    assert set(quick) == QUICK
    for figure in all_figures().values():
        assert figure.goal is not None or not figure.quick, figure.name
        assert 0 < figure.noise < 1 and figure.doc, figure.name


def test_only_takes_a_figure_or_a_benchmark_and_refuses_other_names():
    chosen = select(["input_rr_vs_decode"], quick=False)
    assert [figure.name for figures in chosen.values() for figure in figures] == [
        "input_rr_vs_decode"
    ]
    first_step = select(["first_step"], quick=True)
    assert {figure.name for figures in first_step.values() for figure in figures} == {
        "first_step_1k_s",
        "first_step_1m_extra_s",
    }
    with pytest.raises(BenchmarkUsageError, match="no_such_figure"):
        select(["no_such_figure"], quick=False)


def test_a_record_carries_its_value_goal_machine_date_and_commit():
    chosen = select(["start_help_s"], quick=True)
    [record] = records(chosen, {"start_help_s": [0.2, 0.1, 0.3]}, Tree("this", BENCHMARKS_ROOT))
    assert record["value"] == 0.2 and record["goal"] == 0.5 and record["met"] is True
    assert record["samples"] == [0.2, 0.1, 0.3] and record["unit"] == "s"
    assert "cores" in str(record["machine"]) and str(record["date"]).endswith("UTC")
    assert record["commit"]


def test_benchmarks_md_is_generated_from_the_committed_results():
    """BENCHMARKS.md and docs/speed.md's figures block are what `python -m benchmarks tables
    benchmarks/results/*.json` makes: edit the declarations or rerun, never the pages."""
    results = sorted(
        os.path.join(RESULTS, name) for name in os.listdir(RESULTS) if name.endswith(".json")
    )
    figures = tables.read_results([tables.Path(path) for path in results])
    assert figures, "benchmarks/results holds no figures"
    with open(os.path.join(REPOSITORY, "BENCHMARKS.md")) as page:
        assert page.read() == tables.benchmarks_page(registered(), figures), (
            "BENCHMARKS.md is stale: python -m benchmarks tables benchmarks/results/*.json"
        )
    speed = tables.SPEED_DOC.read_text()
    assert speed == tables.speed_doc(registered(), speed), (
        "docs/speed.md's figures are stale: python -m benchmarks tables benchmarks/results/*.json"
    )
    declared = set(all_figures())
    assert {str(figure["name"]) for figure in figures} <= declared


def run_benchmarks(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *argv],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=60,
    )


RESULTS_FILE = os.path.join(RESULTS, "cpu_2_cores.json")


@pytest.mark.parametrize(
    "argv, names",
    [
        (["run", "--only", "no_such_figure"], "no_such_figure"),
        (["compare", "--base", "/nonexistent", "--quick"], "/nonexistent"),
        (["compare", "--base", "", "--quick"], "--base is empty"),
        (["run", "--quick", "--data", ""], "--data is empty"),
        (["run", "--quick", "--json", "/dev/null"], "not a regular file"),
        (["tables", "/nonexistent.json", "--out", "/tmp/never.md"], "/nonexistent.json"),
        (["tables", RESULTS_FILE, "--out", RESULTS_FILE], "also an input"),
        (["tables", RESULTS_FILE, "--out", str(tables.SPEED_DOC)], "also an input"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_and_nothing_is_written(argv, names):
    before = {path: Path(path).read_text() for path in (RESULTS_FILE, str(tables.SPEED_DOC))}
    done = run_benchmarks(*argv)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert names in line and "Traceback" not in done.stderr
    assert before == {path: Path(path).read_text() for path in before}


def test_an_output_is_written_through_its_link_and_whole_or_not_at_all(tmp_path):
    target = tmp_path / "figures.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    replace_file(output_path(link, "--json"), "new", "--json")
    assert link.is_symlink() and target.read_text() == "new"
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(BenchmarkUsageError, match="not a regular file"):
        output_path(fifo, "--json")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["figures.json", "link.json", "pipe"]


def test_a_results_file_that_is_not_one_is_refused(tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"figures": 3}))
    with pytest.raises(BenchmarkUsageError, match="broken.json"):
        tables.read_results([broken])


def test_compare_judges_the_rounds_differences_not_the_spread_between_rounds():
    """A round's load moves both trees alike: a steady +2 s in each round is caught even where
    the rounds differ among themselves by more, and equal pairs are equal whatever the spread."""
    chosen = select(["first_step_1k_s"], quick=True)
    base = {"first_step_1k_s": [4.0, 9.0, 5.0]}
    [(_, before, after, verdict)] = compared(chosen, {"first_step_1k_s": [6.0, 11.0, 7.0]}, base)
    assert (before, after, verdict) == (5.0, 7.0, "worse")
    [(_, _, _, same)] = compared(chosen, {"first_step_1k_s": [4.2, 8.9, 5.1]}, base)
    assert same == "same"
    [(_, _, _, failed)] = compared(chosen, {"first_step_1k_s": []}, base)
    assert failed == "worse"


NEW_MODULE = """
from benchmarks.registry import LOWER, Figure, benchmark


@benchmark("brand_new", "A new one", (Figure("brand_new_s", "s", LOWER, None, 0.1, "new"),))
def measure(context, tree):
    return {"brand_new_s": 1.0}
"""


def test_a_new_benchmark_module_is_found_without_editing_a_list(tmp_path):
    package = tmp_path / "benchmarks"
    shutil.copytree(
        BENCHMARKS_ROOT / "benchmarks", package, ignore=shutil.ignore_patterns("results")
    )
    (package / "brand_new.py").write_text(NEW_MODULE)
    listed = subprocess.run(
        [sys.executable, "-m", "benchmarks", "list"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPOSITORY}"},
    )
    assert listed.returncode == 0, listed.stderr
    assert "| `brand_new_s` | s |" in listed.stdout


# The pages that quote figures: the manual and the README (BENCHMARKS.md is generated from them).
PAGES = sorted(glob.glob(os.path.join(REPOSITORY, "docs", "*.md"))) + [
    os.path.join(REPOSITORY, "README.md")
]
# A name in backticks that reads as a figure's (the names' convention): a ratio, `x_vs_y`, or one
# ending in its unit, `_s`, `_ms`, `_us`, `_mib`, `_gbps`.
FIGURE_SHAPED = re.compile(
    r"`([a-z][a-z0-9]*(?:_[a-z0-9]+)*(?:_vs_[a-z0-9_]+|_(?:s|ms|us|mib|gbps)))`"
)
# Modules the pages run that measure nothing: a model computed from declared inputs, an input maker.
MEASURE_NOTHING = {"scaling_model", "make_scale_db"}


def test_every_figure_the_docs_name_is_declared():
    """A figure a page quotes by name is one `python -m benchmarks run` re-measures."""
    declared = set(all_figures())
    undeclared = {
        f"{os.path.basename(page)}: {name}"
        for page in PAGES
        for name in FIGURE_SHAPED.findall(Path(page).read_text())
        if name not in declared
    }
    assert sorted(undeclared) == []


def test_every_benchmark_module_the_docs_run_declares_its_figures():
    """`python -m benchmarks.X` on a page is a module whose figures are declared (run alone, it
    prints their detail): no script's number is quoted that no `Figure` re-measures."""
    run = {
        module
        for page in PAGES
        for module in re.findall(r"python -m benchmarks\.(\w+)", Path(page).read_text())
    }
    assert run, "the pages name no benchmark module: the pattern is stale"
    undeclared = [
        module
        for module in sorted(run - MEASURE_NOTHING)
        if DECLARES not in (BENCHMARKS_ROOT / "benchmarks" / f"{module}.py").read_text()
    ]
    assert undeclared == []
