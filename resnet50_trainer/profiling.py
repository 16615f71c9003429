"""`--profile_iters N`: profile N training steps after a warm-up with torch.profiler.

Writes a Chrome trace (chrome://tracing or https://ui.perfetto.dev) next to the run log and prints
the operators that took the most time; the run then goes on as usual.
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
from torch.profiler import ProfilerActivity, profile

log = logging.getLogger(__name__)
WARMUP_STEPS = 5  # first steps pay for cudnn.benchmark, allocator growth and input start-up
TOP_OPERATORS = 15


class StepProfiler:
    """Call step() after every training step; it starts and stops the profiler by itself."""

    def __init__(self, num_steps: int, trace_path: Optional[str], warmup_steps: int = WARMUP_STEPS):
        self.num_steps = num_steps if trace_path else 0
        self.trace_path = trace_path
        self.warmup_steps = warmup_steps
        self.steps_seen = 0
        self._profile: Optional[profile] = None

    def step(self) -> None:
        if not self.num_steps:
            return
        self.steps_seen += 1
        if self.steps_seen == self.warmup_steps:
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            self._profile = profile(activities=activities, record_shapes=False)
            self._profile.__enter__()
        elif self._profile is not None and self.steps_seen == self.warmup_steps + self.num_steps:
            self._finish()

    def close(self) -> None:
        """At the end of the run: a profile still open (the run was shorter) is written as it is."""
        if self._profile is not None:
            self._finish()

    def _finish(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self._profile.__exit__(None, None, None)
        self._profile.export_chrome_trace(self.trace_path)
        sort_by = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        table = self._profile.key_averages().table(sort_by=sort_by, row_limit=TOP_OPERATORS)
        log.info("Profile of %d steps written to %s; top operators:\n%s",
                 self.steps_seen - self.warmup_steps, self.trace_path, table)
        self._profile = None
        self.num_steps = 0
