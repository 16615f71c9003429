"""`--profile_iters N`: profile N training steps after a warm-up with torch.profiler.

Writes a Chrome trace (chrome://tracing or https://ui.perfetto.dev) next to the run log and prints
the operators that took the most time; the run then goes on as usual.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence

import torch
from torch.profiler import ProfilerActivity, profile

from resnet50_trainer.errors import UserError

log = logging.getLogger(__name__)
WARMUP_STEPS = 5  # first steps pay for cudnn.benchmark, allocator growth and input start-up
TOP_OPERATORS = 15


class StepProfiler:
    """Call step() after every training step; it starts and stops the profiler by itself.

    Every process counts the steps; only the one given a `trace_path` profiles. step() and close()
    return True where the profile ends, on every process at the same step, so that a trace that
    could not be written (`failure`, on the profiling process) can stop them all together.
    `devices`: the replica's (two with --model_parallel), all waited for before the profile ends,
    so that the trace holds their kernels."""

    def __init__(
        self,
        num_steps: int,
        trace_path: str | None,
        devices: Sequence[torch.device] = (),
        warmup_steps: int = WARMUP_STEPS,
    ):
        self.num_steps = num_steps
        self.trace_path = trace_path
        self.gpus = sorted({device for device in devices if device.type == "cuda"}, key=str)
        self.warmup_steps = warmup_steps
        self.steps_seen = 0
        self.failure: UserError | None = None
        self._profile: profile | None = None

    def step(self) -> bool:
        if not self.num_steps:
            return False
        self.steps_seen += 1
        if self.steps_seen == self.warmup_steps and self.trace_path:
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            self._profile = profile(activities=activities, record_shapes=False)
            self._profile.__enter__()
        elif self.steps_seen == self.warmup_steps + self.num_steps:
            return self._finish()
        return False

    def close(self) -> bool:
        """At the end of the run: a profile still open (the run was shorter) is written as it is."""
        if self.num_steps and self.steps_seen >= self.warmup_steps:
            return self._finish()
        return False

    def _finish(self) -> bool:
        if self._profile is not None and self.trace_path:  # a profile starts with a trace path only
            for gpu in self.gpus:
                torch.cuda.synchronize(gpu)
            self._profile.__exit__(None, None, None)
            try:
                write_trace(self._profile, self.trace_path)
            except UserError as failure:
                self.failure = failure
            else:
                sort_by = (
                    "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
                )
                table = self._profile.key_averages().table(sort_by=sort_by, row_limit=TOP_OPERATORS)
                log.info(
                    "Profile of %d steps written to %s; top operators:\n%s",
                    self.steps_seen - self.warmup_steps,
                    self.trace_path,
                    table,
                )
            self._profile = None
        self.num_steps = 0
        return True


def write_trace(finished: profile, path: str) -> None:
    """The Chrome trace at `path`, a new file; UserError naming the path and the reason if it cannot
    be written, with nothing of it left behind. The profiler's writer ignores write errors (a full
    disk leaves a truncated file, or none), so it writes into a scratch directory, the result is
    checked complete, and our own copy, whose errors are reported, puts it in place."""
    try:
        with tempfile.TemporaryDirectory(prefix="resnet50-trace-") as scratch:
            exported = os.path.join(scratch, os.path.basename(path))
            finished.export_chrome_trace(exported)
            if not _is_complete(exported):
                raise UserError(
                    f"the profiler could not write its trace in {scratch} (the file "
                    "came out missing or incomplete: is that disk full?): free space "
                    "there, or point TMPDIR at a directory with room"
                )
            copy_to_new_file(exported, path, "the profiler trace")
    except OSError as error:  # the scratch directory itself
        raise UserError(
            f"the profiler could not write its trace in {tempfile.gettempdir()} "
            f"({error.strerror}): free space there, or point TMPDIR at a directory "
            "with room"
        ) from error


def _is_complete(trace_path: str) -> bool:
    try:
        with open(trace_path) as file:
            json.load(file)
    except (OSError, ValueError):
        return False
    return True


def copy_to_new_file(source: str, target: str, what: str) -> None:
    """Copy into `target`, which must not exist; on failure the partial copy (ours) is removed."""
    created = False
    try:
        with open(source, "rb") as reader, open(target, "xb") as writer:
            created = True
            shutil.copyfileobj(reader, writer)
            writer.flush()
            os.fsync(writer.fileno())
    except FileExistsError:
        raise UserError(
            f"{what} {target} already exists: move it away or choose another --log_dir"
        ) from None
    except OSError as error:
        if created:
            with contextlib.suppress(OSError):  # the write's error is the one to report
                os.unlink(target)
        raise UserError(
            f"writing {what} {target} failed ({error.strerror}): free space in "
            "--log_dir or choose another; the files already there are intact"
        ) from error
