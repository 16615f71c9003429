"""The resnet50-plot command: run logs (ours and the original's) drawn as figures."""
