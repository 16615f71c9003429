"""resnet50-export's work: read the checkpoint, write the export beside its destination, check it
against PyTorch, and only then put it in place (an existing file is never half-written)."""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets

import torch

from resnet50_trainer.errors import RunFailed, UserError
from resnet50_trainer.tools.export import formats
from resnet50_trainer.tools.export.check import check_inputs
from resnet50_trainer.tools.export.network import read_network

EXAMPLE_BATCH = 2  # what the exporter traces; the file takes any batch


def export(args: argparse.Namespace, chosen: str) -> None:
    output = args.output
    if os.path.isdir(output):
        raise UserError(f"-o {output} is a directory: give the path of the file to write")
    if os.path.exists(output) and os.path.exists(args.checkpoint):
        if os.path.samefile(output, args.checkpoint):
            raise UserError(
                f"-o {output} is the checkpoint itself, which the export would replace: "
                "give another output path"
            )
    network = read_network(args.checkpoint, args.ema)
    images, described = check_inputs(network, args.check_data, args.check_images)
    temporary = _temporary_beside(output)
    try:
        formats.write(network, chosen, temporary, images[:EXAMPLE_BATCH])
        with torch.inference_mode():
            expected = network.model(images)
        difference = (formats.run(chosen, temporary, images) - expected).abs().max().item()
        print(f"Checked on {described}: largest difference from PyTorch {difference:.3g}")
        if not difference <= args.tolerance:  # NaN too
            raise RunFailed(
                f"the {chosen} export of {args.checkpoint} differs from PyTorch by up to "
                f"{difference:.3g} on {described}, above --tolerance {args.tolerance:g}: "
                f"nothing written to {output}"
            )
        os.replace(temporary, output)
    except OSError as error:
        raise UserError(
            f"-o {output} cannot be written ({error.strerror or error}): choose a writable path "
            "with room for the model"
        ) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    print(network.preprocessing.line())
    print(f"Wrote {output}: {chosen}, {network.description}, any batch size")


def _temporary_beside(output: str) -> str:
    """A new empty file in the output's directory, which the rename into place needs; made with
    the mode a new file gets (mkstemp's is private to its owner)."""
    directory = os.path.dirname(os.path.abspath(output))
    path = os.path.join(directory, f".{os.path.basename(output)}.{secrets.token_hex(4)}.tmp")
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except OSError as error:
        raise UserError(
            f"-o {output} cannot be written ({error.strerror or error}): choose a writable path"
        ) from None
    return path
