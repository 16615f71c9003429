"""The figure of resnet50-plot: the training curves of run logs, overlaid, written as a PNG.

Headless by construction: the figure is drawn by the Agg canvas directly, without pyplot, so no
global matplotlib backend is chosen for the code that imports this module.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
from matplotlib import colormaps, rc_context
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from resnet50_trainer.errors import UserError
from resnet50_trainer.reporting.runlog import NO_TEST_ACCURACY, TOP5_COLUMN
from resnet50_trainer.tools.output_file import replacing
from resnet50_trainer.tools.plot.logfile import RunLog, read_run_log
from resnet50_trainer.tools.plot.size import DEFAULT_DPI, FIGURE_SIZE_INCHES

# Dashed, points where tested; top-5 (where the log has it) dotted, squares.
TEST_ACCURACY_STYLE: dict[str, Any] = {"linestyle": "--", "marker": "o", "markersize": 3}
TOP5_STYLE: dict[str, Any] = {"linestyle": ":", "marker": "s", "markersize": 3}
# The runs' legend stands right of the panels, so it never covers a curve nor, however many runs
# there are, squeezes the panels to nothing: at most LEGEND_ENTRIES lines (the last one counts the
# runs not named), each label cut to LABEL_CHARS characters (in the middle).
LEGEND_ENTRIES = 20
LABEL_CHARS = 80

# (title, y label) of the four panels, left to right, top to bottom.
PANELS = (
    ("Training loss", "loss"),
    ("Accuracy: training and test", "accuracy"),
    ("Learning rate", "learning rate"),
    ("Throughput", "images/s"),
)


def plot_logs(
    paths: Sequence[str | Path],
    output: str | Path,
    dpi: float = DEFAULT_DPI,
    title: str | None = None,
) -> Figure:
    """Read the logs, draw their curves and write a PNG of FIGURE_SIZE_INCHES x dpi pixels to
    output."""
    logs = [read_run_log(path) for path in paths]
    # Text is drawn literally, whatever the user's matplotlibrc says about TeX.
    with rc_context({"text.usetex": False}):
        figure = build_figure(logs, dpi=dpi, title=title)
        _write_png(figure, Path(output))
    return figure


def build_figure(
    logs: Sequence[RunLog], dpi: float = DEFAULT_DPI, title: str | None = None
) -> Figure:
    """One 2 x 2 figure (PANELS) with one colour per log; the legend right of the panels names
    the runs."""
    if not logs:
        raise UserError("no run logs given; pass at least one LOG")
    for log in logs:
        if log.num_rows == 0:
            raise UserError(
                f"{log.path}: has no epoch rows yet, nothing to plot; "
                "wait for the first epoch to end"
            )
    figure = Figure(figsize=FIGURE_SIZE_INCHES, dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)  # attaches itself to the figure
    axes = list(figure.subplots(2, 2, sharex=True).flat)
    loss_axes, accuracy_axes, lr_axes, speed_axes = axes
    for log, label, colour in zip(logs, legend_labels(logs), _colours(len(logs))):
        epochs = log.columns["epoch"]
        loss_axes.plot(epochs, log.columns["loss"], color=colour, label=label)
        accuracy_axes.plot(epochs, log.columns["accuracy"], color=colour)
        _plot_test_accuracy(accuracy_axes, log, "test_accuracy", colour, TEST_ACCURACY_STYLE)
        if TOP5_COLUMN in log.columns:
            _plot_test_accuracy(accuracy_axes, log, TOP5_COLUMN, colour, TOP5_STYLE)
        # Caffe2 logged the rate with the sign of descent (negative); the magnitude is what was set.
        lr_axes.plot(epochs, [abs(rate) for rate in log.columns["learning_rate"]], color=colour)
        speed_axes.plot(epochs, log.columns["inputs_per_sec"], color=colour)
    _decorate(axes, figure, title)
    return figure


def legend_labels(logs: Sequence[RunLog]) -> list[str]:
    """Each log's label; runs with the same parameters are named by their file instead (its name
    holds the parameters), from the directory all the logs share, so they can be told apart."""
    counts = Counter(log.label for log in logs)
    shared = os.path.commonpath([log.path.resolve().parent for log in logs])
    return [
        log.label if counts[log.label] == 1 else os.path.relpath(log.path.resolve(), shared)
        for log in logs
    ]


def _colours(count: int) -> list[Any]:
    """The style's colour cycle (10 colours) while it lasts; past it, as many colours of one
    colour map, so that no two runs share one."""
    if count <= 10:
        return [f"C{index}" for index in range(count)]
    return [colormaps["viridis"](index / (count - 1)) for index in range(count)]


def _shortened(label: str) -> str:
    """A label of at most LABEL_CHARS characters: its start and end (a path's file name) kept."""
    if len(label) <= LABEL_CHARS:
        return label
    half = (LABEL_CHARS - 3) // 2
    return f"{label[:half]}...{label[-(LABEL_CHARS - 3 - half) :]}"


def _runs_legend(figure: Figure, lines: Sequence[Line2D]) -> None:
    """The legend of the runs, right of the panels: LEGEND_ENTRIES at most, the last one counting
    the runs not named."""
    handles = list(lines)
    labels = [_shortened(str(line.get_label())) for line in handles]
    if len(handles) > LEGEND_ENTRIES:
        named = LEGEND_ENTRIES - 1
        handles = handles[:named] + [Line2D([], [], color="none")]
        labels = labels[:named] + [f"... and {len(lines) - named} more runs"]
    # Handles and labels given explicitly: matplotlib leaves out lines whose label starts with "_".
    _literal(figure.legend(handles, labels, loc="outside right upper", fontsize="small"))


def _plot_test_accuracy(
    axes: Axes, log: RunLog, column: str, colour: str, style: dict[str, Any]
) -> None:
    points = [
        (epoch, accuracy)
        for epoch, accuracy in zip(log.columns["epoch"], log.columns[column])
        if accuracy != NO_TEST_ACCURACY
    ]
    if points:
        epochs, accuracies = zip(*points)
        axes.plot(epochs, accuracies, color=colour, label=column, **style)


def _decorate(axes: list[Axes], figure: Figure, title: str | None) -> None:
    for panel_axes, (panel_title, ylabel) in zip(axes, PANELS):
        panel_axes.set_title(panel_title)
        panel_axes.set_ylabel(ylabel)
        panel_axes.grid(True, alpha=0.3)
    for bottom_axes in axes[2:]:
        bottom_axes.set_xlabel("epoch")
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))  # shared by all four panels
    loss_axes, accuracy_axes, lr_axes, _ = axes
    _runs_legend(figure, loss_axes.lines)
    tested = {line.get_label() for line in accuracy_axes.lines}
    if "test_accuracy" in tested:  # some run has test points
        # Proxy lines: they explain the line styles without being drawn on the axes.
        styles = [Line2D([], [], color="grey"), Line2D([], [], color="grey", **TEST_ACCURACY_STYLE)]
        names = ["training", "test"]
        if TOP5_COLUMN in tested:
            styles.append(Line2D([], [], color="grey", **TOP5_STYLE))
            names.append("test top-5")
        accuracy_axes.legend(styles, names, fontsize="small")
    if all(rate > 0 for line in lr_axes.lines for rate in np.asarray(line.get_ydata())):
        lr_axes.set_yscale("log")  # step schedules divide the rate by 10: equal steps on a log axis
    if title:
        figure.suptitle(title, parse_math=False, usetex=False)


def _literal(legend: Legend) -> None:
    """Log names are text, not TeX: a "$" in one must not start mathtext."""
    for text in legend.get_texts():
        text.set_parse_math(False)
        text.set_usetex(False)


def _write_png(figure: Figure, output: Path) -> None:
    """Rendered into a new file that then takes `output`'s place (tools/output_file.py): a PNG
    already there stays whole until the new one is complete (a full disk, an interrupt)."""
    with replacing(str(output), "--output", "room for the figure") as partial:
        with open(partial, "wb") as file:
            # print_png renders at the figure's own dpi, untouched by the user's savefig rc
            # settings.
            cast(FigureCanvasAgg, figure.canvas).print_png(file)  # build_figure attached it
