"""resnet50-export: the command line alone (torch, onnx and onnxruntime load once it holds)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from resnet50_trainer.commands import run_command
from resnet50_trainer.config.parsing import FlagHelpFormatter, OneLineParser, add_version_flag
from resnet50_trainer.config.values import Number, path_value
from resnet50_trainer.errors import UserError
from resnet50_trainer.launch.probes import check_torch_loads
from resnet50_trainer.streams import guard_standard_streams
from resnet50_trainer.tools.export import ONNX, TORCHSCRIPT

PROG = "resnet50-export"
FORMAT_OF_SUFFIX = {".onnx": ONNX, ".pt": TORCHSCRIPT, ".ts": TORCHSCRIPT}
DEFAULT_TOLERANCE = 1e-4  # float32 through another runtime: the sums' order differs, no more
DEFAULT_CHECK_IMAGES = 16


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description="Write a resnet50-trainer checkpoint's network (any depth, a ResNeXt, or "
        "its EMA weights) as ONNX or TorchScript for inference: float32 NCHW input normalised "
        "as in training, any batch size; checked against PyTorch before it is kept, and the "
        "preprocessing it expects recorded in the file and printed.",
        formatter_class=FlagHelpFormatter,
    )
    add_version_flag(parser)
    parser.add_argument(
        "checkpoint",
        metavar="CHECKPOINT",
        type=path_value,
        help="a .pt file resnet50-trainer wrote",
    )
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        type=path_value,
        help="file to write: .onnx is ONNX, .pt or .ts TorchScript (or say so with --format); "
        "an existing file is replaced only once the new one is complete and checked",
    )
    parser.add_argument(
        "--format",
        choices=(ONNX, TORCHSCRIPT),
        help="the output's format (default: from the output's suffix)",
    )
    parser.add_argument(
        "--ema",
        action="store_true",
        help="export the checkpoint's EMA of the weights (a run with --ema_decay) instead of "
        "its weights",
    )
    parser.add_argument(
        "--check_data",
        metavar="DB",
        type=path_value,
        help="LMDB or LevelDB whose first images check the export against PyTorch, "
        "preprocessed as the trainer's test images (default: random inputs)",
    )
    parser.add_argument(
        "--check_images",
        type=Number(int, 1, 4096),
        default=DEFAULT_CHECK_IMAGES,
        help="how many images check the export, in one batch",
    )
    parser.add_argument(
        "--tolerance",
        type=Number(float, 0, 1, above_minimum=True),
        default=DEFAULT_TOLERANCE,
        help="largest difference of a logit between the export and PyTorch for the export "
        "to be kept",
    )
    return parser


def output_format(args: argparse.Namespace) -> str:
    """--format, or the output's suffix; UserError when neither says."""
    if args.format:
        return args.format
    suffix = os.path.splitext(args.output)[1].lower()
    if suffix not in FORMAT_OF_SUFFIX:
        raise UserError(
            f"-o {args.output}: the suffix {suffix or '(none)'} names no format: end it in "
            ".onnx (ONNX) or .pt/.ts (TorchScript), or give --format"
        )
    return FORMAT_OF_SUFFIX[suffix]


def main(argv: Sequence[str] | None = None) -> int:
    guard_standard_streams(PROG)  # --help and a refused argument write too
    args = build_parser().parse_args(argv)
    return run_command(PROG, lambda: _export(args))


def _export(args: argparse.Namespace) -> None:
    chosen = output_format(args)
    check_torch_loads()
    from resnet50_trainer.tools.export.export import export  # torch: once the flags hold

    export(args, chosen)
