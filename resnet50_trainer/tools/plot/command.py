"""resnet50-plot: the training curves of one or more run logs, overlaid in one PNG.

The command line alone: matplotlib (half a second to import) is loaded by figure.py once the
arguments hold.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from resnet50_trainer.commands import run_command
from resnet50_trainer.config.parsing import add_version_flag
from resnet50_trainer.config.values import Number, path_value
from resnet50_trainer.path_words import shown
from resnet50_trainer.streams import guard_standard_streams
from resnet50_trainer.tools.plot.size import DEFAULT_DPI, FIGURE_SIZE_INCHES

DEFAULT_OUTPUT = "plot.png"
PROG = "resnet50-plot"


def _png_path(text: str) -> Path:
    if Path(text).suffix.lower() != ".png":
        raise argparse.ArgumentTypeError(
            f"{text!r} does not end in .png; the plot is written as PNG"
        )
    return Path(path_value(text))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Plot training loss, training and test accuracy (and test top-5 where "
        "logged), learning rate and images/s against epoch from resnet50 run logs (ours or "
        "Caffe2's resnet50_trainer.py); "
        "several logs overlay.",
    )
    add_version_flag(parser)
    parser.add_argument(
        "logs",
        nargs="+",
        metavar="LOG",
        type=path_value,
        help="run log(s), e.g. resnet50_gpu2_b64_L1000_lr0.10_v2_*.log",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=_png_path,
        default=DEFAULT_OUTPUT,  # text: argparse reads it with the type, as one given
        help=f"PNG to write (default: {DEFAULT_OUTPUT} in the current directory)",
    )
    parser.add_argument(
        "--dpi",
        type=Number(float, 0, 1000, above_minimum=True),
        default=DEFAULT_DPI,
        help=f"pixels per inch; the image is {FIGURE_SIZE_INCHES[0]:g} x "
        f"{FIGURE_SIZE_INCHES[1]:g} inches (default: {DEFAULT_DPI:g})",
    )
    parser.add_argument("--title", help="title above the panels (default: none)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    guard_standard_streams(PROG)  # --help and a refused argument write too
    args = build_parser().parse_args(argv)
    return run_command(PROG, lambda: _plot(args))


def _plot(args: argparse.Namespace) -> None:
    from resnet50_trainer.tools.plot.figure import plot_logs  # matplotlib: once the arguments hold

    plot_logs(args.logs, args.output, dpi=args.dpi, title=args.title)
    print(f"wrote {shown(str(args.output))}")
