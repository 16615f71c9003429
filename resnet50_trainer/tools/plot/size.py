"""The figure's size, which command.py states in --help (without importing matplotlib) and
figure.py draws at."""

from __future__ import annotations

FIGURE_SIZE_INCHES = (12.0, 8.0)
DEFAULT_DPI = 100.0
