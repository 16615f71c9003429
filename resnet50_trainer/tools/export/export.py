"""resnet50-export's work: read the checkpoint, write the export beside its destination, check it
against PyTorch, and only then put it in place (an existing file is never half-written)."""

from __future__ import annotations

import argparse
import os

import torch

from resnet50_trainer.errors import RunFailed, UserError
from resnet50_trainer.path_words import shown
from resnet50_trainer.tools.export import formats
from resnet50_trainer.tools.export.check import check_inputs
from resnet50_trainer.tools.export.network import read_network
from resnet50_trainer.tools.output_file import replacing

EXAMPLE_BATCH = 2  # what the exporter traces; the file takes any batch


def export(args: argparse.Namespace, chosen: str) -> None:
    output = args.output
    if os.path.exists(output) and os.path.exists(args.checkpoint):
        if os.path.samefile(output, args.checkpoint):
            raise UserError(
                f"-o {shown(output)} is the checkpoint itself, which the export would replace: "
                "give another output path"
            )
    network = read_network(args.checkpoint, args.ema)
    images, described = check_inputs(network, args.check_data, args.check_images)
    with replacing(output, "-o", "room for the model") as temporary:
        formats.write(network, chosen, temporary, images[:EXAMPLE_BATCH])
        with torch.inference_mode():
            expected = network.model(images)
        difference = (formats.run(chosen, temporary, images) - expected).abs().max().item()
        print(f"Checked on {described}: largest difference from PyTorch {difference:.3g}")
        if not difference <= args.tolerance:  # NaN too
            raise RunFailed(
                f"the {chosen} export of {shown(args.checkpoint)} differs from PyTorch by up to "
                f"{difference:.3g} on {described}, above --tolerance {args.tolerance:g}: "
                f"nothing written to {shown(output)}"
            )
    print(network.preprocessing.line())
    print(f"Wrote {shown(output)}: {chosen}, {network.description}, any batch size")
