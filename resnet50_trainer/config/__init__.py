"""The run's settings, torch-free: the flags (flags/), their value types, the frozen Config and the
settings each component reads, the checks, and the build from the command line (build.py)."""
