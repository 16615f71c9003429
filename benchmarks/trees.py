"""A tree: a checkout whose trainer a benchmark measures, by its path, never the installed one.

Every measurement runs in a fresh process: `Tree.call` runs a function of this benchmarks package
there with the tree's `resnet50_trainer` first on the path (benchmarks/worker.py checks it got
that one), `Tree.trainer` a command line of the tree's trainer. So `compare` can time this tree
and another commit's in one run, each with its own code, and a sleep planted in one tree's
`__init__.py` shows in that tree's start-up figures alone."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.errors import BenchmarkUsageError
from benchmarks.worker import RESULT_PREFIX

# This benchmarks package's own root: its code drives every tree's measurements.
BENCHMARKS_ROOT = Path(__file__).resolve().parent.parent
# The worker's bootstrap: this package found first, then the tree put first for the trainer.
_BOOTSTRAP = (
    "import sys; sys.path.insert(0, sys.argv[1]); from benchmarks import worker; worker.main()"
)
# The C modules setup.py builds in place; a tree without them decodes and resizes more slowly.
EXTENSIONS = ("data/formats/_jpeg_region", "data/_resample")


class MeasurementFailed(RuntimeError):
    """A measuring process failed: its command and the end of its output."""


@contextlib.contextmanager
def own_group(command: list[str], **popen: Any) -> Iterator[subprocess.Popen]:
    """`command` started in a process group of its own, which is killed whole if the caller
    leaves early (an error, Ctrl-C, SIGTERM): no measuring process, nor the trainer's input
    processes it started, outlives the run that needs it."""
    process = subprocess.Popen(command, start_new_session=True, **popen)
    try:
        with process:
            yield process
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        raise


@dataclass(frozen=True)
class Tree:
    name: str
    path: Path

    def environment(self) -> dict[str, str]:
        """The environment of this tree's processes: its trainer alone on PYTHONPATH, unbuffered
        output."""
        return dict(os.environ, PYTHONPATH=str(self.path), PYTHONUNBUFFERED="1")

    def call(self, target: str, threads: int | None = None, **arguments: object) -> Any:
        """`module:function` of this package called with `arguments` in a fresh process that
        imports this tree's trainer; its JSON result. `threads`: OMP_NUM_THREADS there (1 for a
        figure of one core, as a DataLoader worker has)."""
        command = [sys.executable, "-c", _BOOTSTRAP, str(BENCHMARKS_ROOT), str(self.path), target]
        environment = self.environment()
        if threads is not None:
            environment["OMP_NUM_THREADS"] = str(threads)
        with own_group(
            [*command, json.dumps(arguments)],
            env=environment,
            cwd="/",
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as process:
            stdout, stderr = process.communicate()
        results = [line for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)]
        if process.returncode or not results:
            tail = (stdout + stderr)[-3000:]
            raise MeasurementFailed(f"{self.name}: {target} failed ({process.returncode}):\n{tail}")
        return json.loads(results[-1][len(RESULT_PREFIX) :])

    def trainer(self, flags: list[str]) -> list[str]:
        """The command line of this tree's `resnet50-trainer` (run it with `environment()` and a
        working directory outside any tree, so that only PYTHONPATH finds the package)."""
        return [sys.executable, "-m", "resnet50_trainer", *flags]

    def commit(self) -> str:
        """The tree's commit, "+changes" when its tracked files differ from it; "" outside git."""

        def git(*args: str) -> str:
            return subprocess.run(
                ["git", "-C", str(self.path), *args], capture_output=True, text=True
            ).stdout.strip()

        commit = git("rev-parse", "--short=12", "HEAD")
        if commit and git("status", "--porcelain", "--untracked-files=no"):
            commit += "+changes"
        return commit

    def problem(self) -> str | None:
        """Why this tree cannot be measured, or None."""
        if not (self.path / "resnet50_trainer" / "__init__.py").is_file():
            return (
                f"{self.path} holds no resnet50_trainer package: give a checkout of this repository"
            )
        return None

    def missing_extensions(self) -> list[str]:
        package = self.path / "resnet50_trainer"
        return [name for name in EXTENSIONS if not glob.glob(f"{package / name}.*.so")]

    def build(self) -> None:
        """Builds the tree (`_build`); BenchmarkUsageError, one line, where it cannot be."""
        try:
            self._build()
        except subprocess.CalledProcessError as failure:
            said = (failure.stderr or b"").decode(errors="replace").strip().splitlines()
            raise BenchmarkUsageError(
                f"the {self.name} tree {self.path} cannot be built ({' '.join(failure.cmd[1:])}: "
                f"{said[-1] if said else f'exit {failure.returncode}'}): give a working checkout"
            ) from None

    def _build(self) -> None:
        """Builds the tree's C modules in place where they are missing (as scripts/setup.sh does
        for this checkout), so that its figures are its code's, not a fallback's; and its
        bytecode, which a fresh checkout's first command would otherwise compile inside a
        round (a second on these cores)."""
        if self.missing_extensions():
            subprocess.run(
                [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
                cwd=self.path,
                check=True,
                capture_output=True,
            )
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", "resnet50_trainer"],
            cwd=self.path,
            check=True,
            capture_output=True,
        )
