"""What ends a benchmarks command with one line and exit 2."""

from __future__ import annotations


class BenchmarkUsageError(Exception):
    """A command line or file the benchmarks cannot use: one line naming it and the fix."""
