"""resnet50-plot: the training curves of one or more run logs, overlaid in one PNG.

Headless by construction: the figure is drawn by the Agg canvas directly, without pyplot, so no
global matplotlib backend is chosen for the code that imports this module.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import List, Optional, Sequence, Union

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from resnet50_trainer.errors import UserError, run_command
from resnet50_trainer.runlog import NO_TEST_ACCURACY
from resnet50_trainer.tools.logfile import RunLog, read_run_log

FIGURE_SIZE_INCHES = (12.0, 8.0)
DEFAULT_DPI = 100.0
DEFAULT_OUTPUT = "plot.png"
PROG = "resnet50-plot"

TEST_ACCURACY_STYLE = {"linestyle": "--", "marker": "o", "markersize": 3}  # dashed, points where tested

# (title, y label) of the four panels, left to right, top to bottom.
PANELS = (
    ("Training loss", "loss"),
    ("Accuracy: training and test", "accuracy"),
    ("Learning rate", "learning rate"),
    ("Throughput", "images/s"),
)


def plot_logs(
    paths: Sequence[Union[str, Path]],
    output: Union[str, Path],
    dpi: float = DEFAULT_DPI,
    title: Optional[str] = None,
) -> Figure:
    """Read the logs, draw their curves and write a PNG of FIGURE_SIZE_INCHES x dpi pixels to output."""
    logs = [read_run_log(path) for path in paths]
    figure = build_figure(logs, dpi=dpi, title=title)
    _write_png(figure, Path(output))
    return figure


def build_figure(logs: Sequence[RunLog], dpi: float = DEFAULT_DPI, title: Optional[str] = None) -> Figure:
    """One 2 x 2 figure (PANELS) with one colour per log; the legend on the loss panel names the runs."""
    if not logs:
        raise UserError("no run logs given; pass at least one LOG")
    for log in logs:
        if log.num_rows == 0:
            raise UserError(
                f"{log.path}: has no epoch rows yet, nothing to plot; wait for the first epoch to end"
            )
    figure = Figure(figsize=FIGURE_SIZE_INCHES, dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)  # attaches itself to the figure
    axes = list(figure.subplots(2, 2, sharex=True).flat)
    loss_axes, accuracy_axes, lr_axes, speed_axes = axes
    for index, (log, label) in enumerate(zip(logs, legend_labels(logs))):
        colour = f"C{index}"  # the style's colour cycle, wrapping around
        epochs = log.columns["epoch"]
        loss_axes.plot(epochs, log.columns["loss"], color=colour, label=label)
        accuracy_axes.plot(epochs, log.columns["accuracy"], color=colour)
        _plot_test_accuracy(accuracy_axes, log, colour)
        # Caffe2 logged the rate with the sign of descent (negative); the magnitude is what was set.
        lr_axes.plot(epochs, [abs(rate) for rate in log.columns["learning_rate"]], color=colour)
        speed_axes.plot(epochs, log.columns["inputs_per_sec"], color=colour)
    _decorate(axes, figure, title)
    return figure


def legend_labels(logs: Sequence[RunLog]) -> List[str]:
    """Each log's label; runs with the same parameters also name their file so they can be told apart."""
    counts = Counter(log.label for log in logs)
    return [log.label if counts[log.label] == 1 else f"{log.label} ({log.path})" for log in logs]


def _plot_test_accuracy(axes: Axes, log: RunLog, colour: str) -> None:
    points = [
        (epoch, accuracy)
        for epoch, accuracy in zip(log.columns["epoch"], log.columns["test_accuracy"])
        if accuracy != NO_TEST_ACCURACY
    ]
    if points:
        epochs, accuracies = zip(*points)
        axes.plot(epochs, accuracies, color=colour, **TEST_ACCURACY_STYLE)


def _decorate(axes: List[Axes], figure: Figure, title: Optional[str]) -> None:
    for panel_axes, (panel_title, ylabel) in zip(axes, PANELS):
        panel_axes.set_title(panel_title)
        panel_axes.set_ylabel(ylabel)
        panel_axes.grid(True, alpha=0.3)
    for bottom_axes in axes[2:]:
        bottom_axes.set_xlabel("epoch")
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))  # shared by all four panels
    loss_axes, accuracy_axes, lr_axes, _ = axes
    loss_axes.legend(fontsize="small")
    if len(accuracy_axes.lines) > len(loss_axes.lines):  # some run has test points
        # Proxy lines: they explain the line styles without being drawn on the axes.
        styles = [Line2D([], [], color="grey"), Line2D([], [], color="grey", **TEST_ACCURACY_STYLE)]
        accuracy_axes.legend(styles, ["training", "test"], fontsize="small")
    if all(rate > 0 for line in lr_axes.lines for rate in line.get_ydata()):
        lr_axes.set_yscale("log")  # step schedules divide the rate by 10: equal steps on a log axis
    if title:
        figure.suptitle(title)


def _write_png(figure: Figure, output: Path) -> None:
    try:
        # print_png renders at the figure's own dpi, untouched by the user's savefig rc settings.
        figure.canvas.print_png(str(output))
    except OSError as exc:
        raise UserError(f"cannot write {output}: {exc.strerror or exc}; choose another --output") from None


def _png_path(text: str) -> Path:
    if Path(text).suffix.lower() != ".png":
        raise argparse.ArgumentTypeError(f"{text!r} does not end in .png; the plot is written as PNG")
    return Path(text)


def _positive_dpi(text: str) -> float:
    try:
        dpi = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < dpi <= 1000:
        raise argparse.ArgumentTypeError(f"{text!r} is outside 0 < dpi <= 1000")
    return dpi


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Plot training loss, training and test accuracy, learning rate and images/s against "
        "epoch from resnet50 run logs (ours or Caffe2's resnet50_trainer.py); several logs overlay.",
    )
    parser.add_argument(
        "logs", nargs="+", metavar="LOG", help="run log(s), e.g. resnet50_gpu2_b64_L1000_lr0.10_v2_*.log"
    )
    parser.add_argument(
        "-o",
        "--output",
        type=_png_path,
        default=Path(DEFAULT_OUTPUT),
        help=f"PNG to write (default: {DEFAULT_OUTPUT} in the current directory)",
    )
    parser.add_argument(
        "--dpi",
        type=_positive_dpi,
        default=DEFAULT_DPI,
        help=f"pixels per inch; the image is {FIGURE_SIZE_INCHES[0]:g} x {FIGURE_SIZE_INCHES[1]:g} inches "
        f"(default: {DEFAULT_DPI:g})",
    )
    parser.add_argument("--title", help="title above the panels (default: none)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = build_parser().parse_args(argv)
    status = run_command(PROG, lambda: _plot(args))
    if status:
        sys.exit(status)


def _plot(args: argparse.Namespace) -> None:
    plot_logs(args.logs, args.output, dpi=args.dpi, title=args.title)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
