"""`python -m benchmarks compare` on real trees: each tree's own trainer is measured (a sleep
planted in one copy's resnet50_trainer/__init__.py shows in that copy's start-up figure, exit 1,
the figure named), two copies of the same code compare clean (exit 0), and a base that cannot
run is no pass (exit 1, the figures named as not compared)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.trainer_runs import REPOSITORY

PLANTED = "\nimport time as _planted_time\n\n_planted_time.sleep(2)\n"


def copy_of_this_tree(target) -> str:
    """The trainer (its built C modules too) and the benchmarks, which is all a tree needs."""
    for folder in ("resnet50_trainer", "benchmarks"):
        shutil.copytree(
            f"{REPOSITORY}/{folder}", target / folder, ignore=shutil.ignore_patterns("__pycache__")
        )
    return str(target)


def compare(this: str, base: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "compare", "--base", base, "--quick"]
        + ["--only", "start_help_s"],
        cwd=this,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_sleep_planted_in_this_tree_is_caught_and_an_unchanged_copy_is_not(tmp_path):
    planted = copy_of_this_tree(tmp_path / "planted")
    with open(f"{planted}/resnet50_trainer/__init__.py", "a") as init:
        init.write(PLANTED)
    caught = compare(planted, REPOSITORY)
    assert caught.returncode == 1, caught.stdout + caught.stderr
    assert "worse than --base beyond the noise band: start_help_s" in caught.stdout
    clean = compare(REPOSITORY, copy_of_this_tree(tmp_path / "copy"))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "no figure worse than --base" in clean.stdout


def test_a_base_that_cannot_run_is_not_a_pass(tmp_path):
    broken = copy_of_this_tree(tmp_path / "broken")
    with open(f"{broken}/resnet50_trainer/__init__.py", "a") as init:
        init.write("\nraise RuntimeError('planted')\n")
    done = compare(REPOSITORY, broken)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "not compared (the base did not measure them): start_help_s" in done.stdout


def test_a_sleep_planted_in_each_step_shows_in_the_step_overhead_figure(tmp_path):
    """The figure `compare` guards (step_overhead_vs_bare_loop) sees a per-step cost the trainer
    adds: 200 ms slept in each step's pass shows as at least half of it more than the bare loop's
    step (about 40-70 ms, each loop timed alone on a loaded machine, so only the sum is firm)."""
    from benchmarks.step_overhead import step_figures
    from benchmarks.trees import Tree

    planted = copy_of_this_tree(tmp_path / "planted")
    step = Path(planted, "resnet50_trainer", "train", "step.py")
    source = step.read_text()
    first_line = "    images, targets, dominant_labels = pass_inputs"
    assert first_line in source
    step.write_text(source.replace(first_line, f"    __import__('time').sleep(0.2)\n{first_line}"))
    figures = step_figures(Tree("planted", Path(planted)), str(tmp_path), timed=20)
    added_ms = figures["step_trainer_ms"] - figures["step_bare_loop_ms"]
    assert added_ms > 100 and figures["step_overhead_vs_bare_loop"] > 1.5, figures
