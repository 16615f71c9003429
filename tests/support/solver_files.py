"""Caffe solver files for the --solver tests: a ported ResNet-50 step solver, written where a test
wants it."""

from __future__ import annotations

# Epochs of 4 iterations (test_interval), 12 iterations in all; SMALL_RUN's batch is 8.
STEP_SOLVER = """# a ResNet-50 solver, ported
net: "models/ResNet-50-train_val.prototxt"
test_iter: 2
test_interval: 4
base_lr: 0.2
lr_policy: "step"
stepsize: 6
gamma: 0.5
momentum: 0.9
weight_decay: 0.0005
max_iter: 12
display: 1
snapshot: 2
type: "SGD"
"""


def solver_file(tmp_path, text: str, name: str = "solver.prototxt") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)
