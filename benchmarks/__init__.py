"""The project's benchmarks: every figure the docs quote, declared once with its unit, goal and
noise band, measured by one command (`python -m benchmarks run|compare|tables`, docs/speed.md).

Not installed with the trainer: run from the repository root. Each measurement runs in a fresh
process that imports the trainer from the tree being measured (benchmarks/trees.py), never from
whatever is installed, so two checkouts compare in one run."""
