"""Start-up figures: how long a command takes to answer `--help`, a small run to its first step on
a 1,000-record and on an ImageNet-sized (1,281,167-record) LMDB, the CPU a small run of two
training processes costs (most of it their start), and the preflight of a cold
ImageNet-sized test DB (50,000 records of 120 KB, 5.8 GB). The DBs come from
benchmarks/make_scale_db.py (tiny JPEGs with keys shaped like convert_imageset's; the test DB's
padded to ImageNet's record size) and are kept in the data folder (about 7 GB, a minute to make)."""

from __future__ import annotations

import ctypes
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.registry import LOWER, Context, Figure, benchmark
from benchmarks.trees import BENCHMARKS_ROOT, MeasurementFailed, Tree, own_group

# name: (records, bytes a record or 0 for a tiny JPEG)
SCALE_DBS = {"train_1k": (1000, 0), "train_1m": (1_281_167, 0), "test_50k": (50_000, 120_000)}
# A small CPU run: ResNet-18, 32 px, batch 8, 2 input processes; its first step's line ends the
# figure (the run's start: flags, preflight, keys, process start, model build, first batch).
FIRST_STEP_FLAGS = (
    "--use_cpu --num_layers 18 --image_size 32 --batch_size 8 --num_labels 1000 --num_workers 2 "
    "--print_every 1 --epoch_size 16 --num_epochs 1"
).split()
FIRST_STEP_LINE = "Finished iteration 1/"
# Two training processes with an input process each, on 16 images of the 1k LMDB: the training
# itself is a few seconds of CPU; the rest is starting the processes (torch's import is ~3 s each).
TWO_PROCESS_FLAGS = (
    "--use_cpu --num_layers 18 --image_size 32 --batch_size 8 --num_labels 1000 --num_gpus 2 "
    "--num_workers 1 --epoch_size 16 --num_epochs 1"
).split()
_PR_SET_CHILD_SUBREAPER = 36  # <sys/prctl.h>


def scale_db(context: Context, name: str) -> Path:
    return context.data / "scale" / name


def make_scale_dbs(context: Context) -> None:
    """Each DB of SCALE_DBS that the data folder lacks, built beside it and renamed into place
    complete (a run stopped midway leaves no half DB that a later run would take)."""
    for name, (records, record_bytes) in SCALE_DBS.items():
        target = scale_db(context, name)
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{name}.") as building:
            partial = Path(building) / name
            command = [sys.executable, "-m", "benchmarks.make_scale_db", str(partial)]
            command += ["--records", str(records), "--record_bytes", str(record_bytes)]
            with own_group(command, cwd=BENCHMARKS_ROOT, stderr=subprocess.PIPE, text=True) as made:
                _, said = made.communicate()
            if made.returncode:
                last = said.strip().splitlines()[-1] if said.strip() else f"exit {made.returncode}"
                raise MeasurementFailed(f"{name} could not be made in {target.parent}: {last}")
            put_in_place(partial, target)


def put_in_place(built: Path, target: Path) -> None:
    """Renames a finished build to `target`; where another run put one there meanwhile (two runs
    sharing --data), that one is kept and this one dropped with its folder."""
    try:
        built.rename(target)
    except OSError:
        if not target.is_dir():
            raise


def seconds_to_line(tree: Tree, flags: list[str], line: str, cwd: Path) -> float:
    """Seconds from launching the tree's trainer with `flags` to the first output line holding
    `line`; the run is then left to finish (its exit status must be 0)."""
    started = time.perf_counter()
    with own_group(
        tree.trainer(flags),
        cwd=cwd,
        env=tree.environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as process:
        assert process.stdout is not None
        seen: list[str] = []
        seconds = None
        for output in process.stdout:
            seen.append(output)
            if seconds is None and line in output:
                seconds = time.perf_counter() - started
    if seconds is None or process.returncode:
        tail = "".join(seen[-20:])
        raise MeasurementFailed(
            f"{' '.join(flags)}: exit {process.returncode}, no {line!r}:\n{tail}"
        )
    return seconds


@contextmanager
def run_on(context: Context, flags: list[str], db: str) -> Iterator[tuple[list[str], str]]:
    """The flags of a run on scale DB `db` that writes its log and checkpoints into a fresh
    directory (the second value), removed afterwards."""
    with tempfile.TemporaryDirectory(dir=context.scratch) as outputs:
        data = ["--train_data", str(scale_db(context, db))]
        yield [*flags, *data, "--checkpoint_dir", outputs, "--log_dir", outputs], outputs


def first_step_s(context: Context, tree: Tree, db: str) -> float:
    with run_on(context, FIRST_STEP_FLAGS, db) as (flags, outputs):
        return seconds_to_line(tree, flags, FIRST_STEP_LINE, Path(outputs))


@benchmark(
    "help",
    "Command start-up",
    (
        Figure(
            "start_help_s",
            "s",
            LOWER,
            0.5,
            0.3,
            "`resnet50-trainer --help`, wall seconds from launch to its usage line (torch is not "
            "imported before the flags hold); a round's value is the median of 3 launches",
            floor=0.1,
            quick=True,
        ),
    ),
    order=10,
)
def measure_help(context: Context, tree: Tree) -> dict[str, float]:
    times = [seconds_to_line(tree, ["--help"], "usage:", context.scratch) for _ in range(3)]
    return {"start_help_s": statistics.median(times)}


@benchmark(
    "first_step",
    "Time to the first step",
    (
        Figure(
            "first_step_1k_s",
            "s",
            LOWER,
            10.0,
            0.15,
            "launch to the first `Finished iteration` line of a small CPU run (ResNet-18, 32 px, "
            "batch 8, 2 input processes) on a 1,000-record LMDB",
            floor=0.75,
            quick=True,
        ),
        Figure(
            "first_step_1m_extra_s",
            "s",
            LOWER,
            3.0,
            0.3,
            "the same run on a 1,281,167-record LMDB (ImageNet's count), minus the 1k figure of "
            "the same round: what the DB's size adds before the first step",
            floor=1.0,
            quick=True,
        ),
    ),
    prepare=make_scale_dbs,
    order=10,
)
def measure_first_step(context: Context, tree: Tree) -> dict[str, float]:
    small = first_step_s(context, tree, "train_1k")
    large = first_step_s(context, tree, "train_1m")
    return {"first_step_1k_s": small, "first_step_1m_extra_s": large - small}


@benchmark(
    "run_cpu",
    "CPU of a run's processes",
    (
        Figure(
            "run_cpu_2p_s",
            "s",
            LOWER,
            20.0,
            0.15,
            "CPU seconds (user + system) of every process of a small run of 2 CPU training "
            "processes with 1 input process each (ResNet-18, 32 px, 16 images of the 1k LMDB, 1 "
            "epoch): most of it is starting them",
            floor=1.0,
            quick=True,
        ),
    ),
    prepare=make_scale_dbs,
    order=10,
)
def measure_run_cpu(context: Context, tree: Tree) -> dict[str, float]:
    with run_on(context, TWO_PROCESS_FLAGS, "train_1k") as (flags, outputs):
        seconds = tree.call(
            "benchmarks.startup:cpu_seconds_of", command=tree.trainer(flags), cwd=outputs
        )
    return {"run_cpu_2p_s": float(seconds)}


def cpu_seconds_of(command: list[str], cwd: str) -> float:
    """CPU seconds (user + system) of `command` and of every process it started, wherever they
    were reaped: this (fresh) process adopts their orphans (Linux's child subreaper) and reaps
    them all, so each one's time, and its reaped children's, is counted in this one's children's."""
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise MeasurementFailed(f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise MeasurementFailed(
            f"{' '.join(command)}: exit {done.returncode}:\n{done.stderr[-3000:]}"
        )
    while True:  # the orphans: the run's fork server, the resource tracker
        try:
            os.wait()
        except ChildProcessError:
            break
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def evict(db: Path) -> None:
    """Drops the DB's files from the page cache (clean pages only: nothing is lost), as on a
    machine that has not read them lately."""
    for name in os.listdir(db):
        descriptor = os.open(db / name, os.O_RDONLY)
        try:
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def timed_preflight(train: str, test: str, outputs: str) -> float:
    """Seconds of the trainer's preflight (launch/preflight.check_inputs) for a run of `train`
    tested on `test`, both evicted from the page cache first. Runs in the tree's process."""
    from resnet50_trainer.cli import build_parser, config_from_args
    from resnet50_trainer.launch.preflight import check_inputs

    flags = ["--train_data", train, "--test_data", test, "--num_labels", "1000", "--use_cpu"]
    flags += ["--checkpoint_dir", outputs, "--log_dir", outputs]
    config = config_from_args(build_parser().parse_args(flags), 0)
    evict(Path(train))
    evict(Path(test))
    started = time.perf_counter()
    lock = check_inputs(config)
    seconds = time.perf_counter() - started
    if lock is not None:
        lock.release()
    return seconds


def cold_reads_unavailable() -> str | None:
    return None if hasattr(os, "posix_fadvise") else "no posix_fadvise to evict the DB"


@benchmark(
    "preflight",
    "Preflight of a cold test DB",
    (
        Figure(
            "preflight_50k_s",
            "s",
            LOWER,
            6.0,
            0.2,
            "the checks before a run starts (launch/preflight.py) of a run tested on a "
            "50,000-record, 5.8 GB LMDB evicted from the page cache: bounded by its 5 s label scan",
            floor=1.0,
            quick=True,
        ),
    ),
    prepare=make_scale_dbs,
    unavailable=cold_reads_unavailable,
    order=10,
)
def measure_preflight(context: Context, tree: Tree) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=context.scratch) as outputs:
        seconds = tree.call(
            "benchmarks.startup:timed_preflight",
            train=str(scale_db(context, "train_1k")),
            test=str(scale_db(context, "test_50k")),
            outputs=outputs,
        )
    return {"preflight_50k_s": float(seconds)}
