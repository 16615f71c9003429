"""The cores this machine gives the run: those its processes may run on (a Slurm task's, a
`taskset`'s or a container's cpuset), not every core of the machine. Torch-free."""

from __future__ import annotations

import os


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity on this OS
        return os.cpu_count() or 1


def cores_per_process(processes: int) -> int:
    """Each of `processes` training processes' share of the available cores, at least 1."""
    return max(1, available_cores() // processes)
