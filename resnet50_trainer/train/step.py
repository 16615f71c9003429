"""One pass of a training step on this process's replica: forward under its precision, the
loss, backward through the scaler, DDP's all-reduce in the last pass (named if a peer is lost
there); the epoch loop (epoch_loop.py) runs the step's passes and the optimizer."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from resnet50_trainer.distributed import process_group
from resnet50_trainer.model.replica import Replica


def forward_backward(
    replica: Replica,
    pass_inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    passes: int,
    last: bool,
    label_smoothing: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One pass of a step's `passes`: its share of the loss (the step's mean) and its correct
    predictions (with mixed targets, a prediction is right when it is the label of the larger
    share). Gradients add up over the passes; DDP all-reduces them in the last."""
    images, targets, dominant_labels = pass_inputs  # the pass's part of the (mixed) batch
    precision = replica.precision
    with contextlib.ExitStack() as passes_before_the_last:
        if not last:
            passes_before_the_last.enter_context(replica.no_sync())
        with (
            process_group.waiting_for_peers("the step's buffer broadcast"),
            precision.autocast(),
        ):
            logits = replica.train_model(precision.inputs(images))
            loss = F.cross_entropy(logits, targets, label_smoothing=label_smoothing) / passes
        with process_group.waiting_for_peers("the step's gradient all-reduce"):
            precision.backward(loss)
    return loss.detach(), (logits.argmax(1) == dominant_labels).sum()
