"""resnet50-export: a trained checkpoint as an ONNX or TorchScript file for inference."""
