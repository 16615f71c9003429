"""Writing a network as ONNX or TorchScript with its preprocessing in the file's metadata, and
running what was written (onnxruntime; torch.jit.load) on a batch."""

from __future__ import annotations

import io
import json
import warnings

import torch

from resnet50_trainer.errors import UserError
from resnet50_trainer.tools.export import ONNX
from resnet50_trainer.tools.export.network import Network

INPUT, OUTPUT = "images", "logits"
PREPROCESSING_FILE = "preprocessing.json"  # a TorchScript file's extra file
ONNX_OPSET = 18


def write(network: Network, chosen: str, path: str, example: torch.Tensor) -> None:
    """The network at `path` in format `chosen`, traced on `example` with its batch dimension
    left free."""
    if chosen == ONNX:
        _write_onnx(network, path, example)
    else:
        _write_torchscript(network, path)


def run(chosen: str, path: str, images: torch.Tensor) -> torch.Tensor:
    """The logits of the file at `path` for `images`."""
    if chosen == ONNX:
        import onnxruntime

        session = onnxruntime.InferenceSession(_contents(path), providers=["CPUExecutionProvider"])
        return torch.from_numpy(session.run([OUTPUT], {INPUT: images.numpy()})[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit's own deprecation
        model = torch.jit.load(io.BytesIO(_contents(path)), map_location="cpu")
    with torch.inference_mode():
        return model(images)


def read_metadata(chosen: str, path: str) -> dict[str, str]:
    """The preprocessing entries the file holds (as Preprocessing.as_metadata made them)."""
    if chosen == ONNX:
        import onnx

        return {entry.key: entry.value for entry in onnx.load(path).metadata_props}
    extra = {PREPROCESSING_FILE: ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.load(io.BytesIO(_contents(path)), map_location="cpu", _extra_files=extra)
    return json.loads(extra[PREPROCESSING_FILE])


def _contents(path: str) -> bytes:
    """The file, read by Python: torch's and onnxruntime's C++ take a path as UTF-8, which a name
    the OS took may not be (a TypeError where it holds a byte such as 0xff)."""
    with open(path, "rb") as file:
        return file.read()


def _write_onnx(network: Network, path: str, example: torch.Tensor) -> None:
    try:
        import onnx
        import onnxscript  # noqa: F401 (torch.onnx's exporter needs it)
    except ImportError as error:
        raise UserError(
            f"ONNX export needs the {error.name} package: pip install "
            "'resnet50-trainer[export]' (or write TorchScript: -o model.pt)"
        ) from None
    batch = torch.export.Dim("batch", min=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes on its own internals
        program = torch.onnx.export(
            network.model,
            (example,),
            dynamo=True,
            input_names=[INPUT],
            output_names=[OUTPUT],
            dynamic_shapes=({0: batch},),
            opset_version=ONNX_OPSET,
            verbose=False,
        )
    assert program is not None, "torch.onnx.export returns its program when given no file"
    proto = program.model_proto
    for key, value in network.preprocessing.as_metadata().items():
        proto.metadata_props.add(key=key, value=value)
    proto.doc_string = network.description
    onnx.save(proto, path)


def _write_torchscript(network: Network, path: str) -> None:
    metadata = json.dumps(network.preprocessing.as_metadata())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit's own deprecation
        scripted = torch.jit.script(network.model)
        # Into memory, then written by Python: torch's C++ writer aborts the process on a full
        # disk (c10::Error), where Python's write raises the OSError the export reports.
        buffer = io.BytesIO()
        torch.jit.save(scripted, buffer, _extra_files={PREPROCESSING_FILE: metadata})
    with open(path, "wb") as file:
        file.write(buffer.getbuffer())
