"""`--profile_iters N`: profile N training steps after a warm-up with torch.profiler, and say in
one line where their time went (reporting/trace_report.py).

Writes the trace next to the run log as gzipped Chrome JSON (https://ui.perfetto.dev or
chrome://tracing open it as it is) and, beside it, a markdown table of the same analysis and the
operators that took the most time; the run then goes on as usual.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import BinaryIO

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from resnet50_trainer.errors import UserError
from resnet50_trainer.path_words import shown
from resnet50_trainer.reporting.trace_report import TraceReport, read_trace

log = logging.getLogger(__name__)
# Steps before the profile: the first pay for cudnn.benchmark, allocator growth and the input
# processes' start; the figures' steady state begins after 20 (benchmarks/train.py).
WARMUP_STEPS = 20
TOP_OPERATORS = 15
TRACE_SUFFIX, TABLE_SUFFIX = ".trace.json.gz", ".profile.md"


def profile_paths(log_path: str) -> tuple[str, str]:
    """The trace's and the table's paths beside a run log."""
    stem = os.path.splitext(log_path)[0]
    return stem + TRACE_SUFFIX, stem + TABLE_SUFFIX


class StepProfiler:
    """Call step() after every training step; it starts and stops the profiler by itself.

    Every process counts the steps; only the one given a `log_path` profiles (its trace and table
    go beside the log: profile_paths). step() and close() return True where the profile ends, on
    every process at the same step, so that a trace that could not be written (`failure`, on the
    profiling process) can stop them all together.
    `devices`: the replica's (two with --model_parallel), all waited for before the profile ends,
    so that the trace holds their kernels. `steps_in_run`: the steps this run has left, so that
    a short run's warm-up leaves room for the profile."""

    def __init__(
        self,
        num_steps: int,
        log_path: str | None,
        devices: Sequence[torch.device] = (),
        steps_in_run: int | None = None,
    ):
        self.num_steps = num_steps
        self.paths = profile_paths(log_path) if log_path else None
        self.gpus = sorted({device for device in devices if device.type == "cuda"}, key=str)
        room = WARMUP_STEPS if steps_in_run is None else steps_in_run - num_steps - 1
        # The profiler starts a step early and discards it: starting the tracer takes time.
        self.starts_after = max(1, min(WARMUP_STEPS, room))
        # Ends with the run's last step where the run is shorter: what follows the last step
        # (the epoch's evaluation, its checkpoint) is no step.
        self._scheduled_end = self.starts_after + 1 + num_steps
        self.ends_after = self._scheduled_end
        if steps_in_run is not None:
            self.ends_after = min(self.ends_after, steps_in_run)
        self.steps_seen = 0
        self.failure: UserError | None = None
        self._profile: profile | None = None

    def step(self) -> bool:
        if not self.num_steps:
            return False
        self.steps_seen += 1
        if self.steps_seen == self.starts_after and self.paths:
            self._profile = profile(
                activities=_activities(),
                schedule=schedule(wait=0, warmup=1, active=self.num_steps, repeat=1),
            )
            self._profile.__enter__()
        elif self._profile is not None:
            if self.steps_seen in (self.starts_after + 1, self.ends_after):
                self._wait_for_gpus()  # the trace holds the recorded steps' kernels, theirs alone
            if self.steps_seen < self.ends_after or self.ends_after == self._scheduled_end:
                # The end of a recorded step (or of the discarded one); at the schedule's end,
                # of the recording. A profile cut short by the run's end closes its last step
                # on leaving, and opens no other.
                self._profile.step()
        if self.steps_seen == self.ends_after:
            return self._finish()
        return False

    def close(self) -> bool:
        """At the end of the run: a profile still open (the run was shorter) is written as it is;
        one that recorded nothing is said so."""
        if not self.num_steps:
            return False
        if self.steps_seen >= self.starts_after:
            self._wait_for_gpus()
            return self._finish()
        self._say_nothing_recorded()
        return False

    def _wait_for_gpus(self) -> None:
        """Before the recording starts (the discarded step's kernels are not the recorded
        steps') and before it ends (its kernels, run, are in the trace)."""
        for gpu in self.gpus:
            torch.cuda.synchronize(gpu)

    def _finish(self) -> bool:
        recorded = self.steps_seen - self.starts_after - 1
        if self._profile is not None:
            self._profile.__exit__(None, None, None)
            if recorded > 0 and self.paths:
                self._write(self._profile)
            self._profile = None
        if recorded <= 0:
            self._say_nothing_recorded()
        self.num_steps = 0
        return True

    def _say_nothing_recorded(self) -> None:
        if self.paths:  # the first process speaks for all
            log.warning(
                "--profile_iters %d recorded nothing: the run took %d step%s, and a profile "
                "starts after at least one and discards its first: give the run %d steps or more",
                self.num_steps,
                self.steps_seen,
                "s" * (self.steps_seen != 1),
                self.starts_after + 2,
            )

    def _write(self, finished: profile) -> None:
        trace_path, table_path = self.paths or ("", "")
        try:
            report = write_trace(finished, trace_path, table_path)
        except UserError as failure:
            self.failure = failure
            return
        if report is None:
            return
        missing = (
            " (no GPU activity was recorded: the profiler could not trace CUDA here, as where "
            "CUPTI is missing or not permitted)"
            if self.gpus and report.device is None
            else ""
        )
        log.info(
            "Profile of %s%s; table %s, trace %s",
            report.line(),
            missing,
            shown(table_path),
            shown(trace_path),
        )


def _activities() -> list[ProfilerActivity]:
    # Kineto's own log lines (its stages; on a machine without a GPU, that it found none) would
    # interleave with the run's: the summary line says what it recorded.
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    return activities


def write_trace(finished: profile, trace_path: str, table_path: str) -> TraceReport | None:
    """The gzipped Chrome trace at `trace_path` and its analysis at `table_path`, new files; the
    analysis returned (None, with a warning, where it failed: the trace stands). UserError naming
    the path and the reason where either cannot be written, with nothing of them left behind. The
    profiler's writer ignores write errors (a full disk leaves a truncated file, or none), so it
    writes into a scratch directory, the result is read back whole, and our own writes, whose
    errors are reported, put it in place."""
    try:
        with tempfile.TemporaryDirectory(prefix="resnet50-trace-") as scratch:
            exported = os.path.join(scratch, "trace.json")
            finished.export_chrome_trace(exported)
            trace = _read_back(exported, scratch)
            with open(exported, "rb") as source:
                write_new_file(trace_path, "the profiler trace", lambda file: _gzip(source, file))
    except OSError as error:  # the scratch directory itself
        raise UserError(
            f"the profiler could not write its trace in {shown(tempfile.gettempdir())} "
            f"({error.strerror}): free space there, or point TMPDIR at a directory "
            "with room"
        ) from error
    try:
        report = read_trace(trace)
        table = report.table(f"Profile of {os.path.basename(trace_path)}") + _operators(finished)
    except Exception as error:  # the analysis is best effort: the trace stands
        log.warning(
            "The profile's analysis failed (%s: %s); its trace is written: %s",
            type(error).__name__,
            error,
            shown(trace_path),
        )
        return None
    try:
        write_new_file(table_path, "the profile's table", lambda file: file.write(table.encode()))
    except UserError:
        with contextlib.suppress(OSError):  # ours, just written: the table's error is the one
            os.unlink(trace_path)
        raise
    return report


def _read_back(exported: str, scratch: str) -> dict:
    try:
        with open(exported) as file:
            return json.load(file)
    except (OSError, ValueError):
        raise UserError(
            f"the profiler could not write its trace in {shown(scratch)} (the file came out "
            "missing or incomplete: is that disk full?): free space there, or point TMPDIR at a "
            "directory with room"
        ) from None


def _gzip(source: BinaryIO, target: BinaryIO) -> None:
    with gzip.GzipFile(fileobj=target, mode="wb", compresslevel=6) as compressed:
        shutil.copyfileobj(source, compressed)


def _operators(finished: profile) -> str:
    sort_by = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    table = finished.key_averages().table(sort_by=sort_by, row_limit=TOP_OPERATORS)
    return f"\nThe operators that took the most time:\n\n```\n{table}\n```\n"


def write_new_file(target: str, what: str, write: Callable[[BinaryIO], object]) -> None:
    """`write` into `target`, which must not exist; on failure the partial file (ours) is
    removed."""
    created = False
    try:
        with open(target, "xb") as file:
            created = True
            write(file)
            file.flush()
            os.fsync(file.fileno())
    except FileExistsError:
        raise UserError(
            f"{what} {shown(target)} already exists: move it away or choose another --log_dir"
        ) from None
    except OSError as error:
        if created:
            with contextlib.suppress(OSError):  # the write's error is the one to report
                os.unlink(target)
        raise UserError(
            f"writing {what} {shown(target)} failed ({error.strerror}): free space in "
            "--log_dir or choose another; the files already there are intact"
        ) from error
