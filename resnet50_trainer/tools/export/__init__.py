"""resnet50-export: a trained checkpoint as an ONNX or TorchScript file for inference."""

from __future__ import annotations

ONNX, TORCHSCRIPT = "onnx", "torchscript"  # the formats it writes
