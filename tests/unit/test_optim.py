"""The optimizer's fused kernel (the GPU's) under the float16 gradient scaler: a step the scaler
skips leaves the weights where the per-tensor kernels leave them. Run here with PyTorch's CPU
fused SGD and CPU gradient scaler, the same Python path as on a GPU."""

from __future__ import annotations

import pytest
import torch

from resnet50_trainer.model.optim import start_momentum_at_zero

SHAPES = [(64, 3, 3, 3), (64,), (1000, 64)]


def train(fused: bool, overflowing_steps: set[int], steps: int = 4) -> list[torch.Tensor]:
    """`steps` steps of SGD as the trainer's (Nesterov 0.9, weight decay) through a gradient
    scaler; the gradients of `overflowing_steps` are inf, as float16's often are at the start."""
    generator = torch.Generator().manual_seed(0)
    parameters = [torch.nn.Parameter(torch.randn(s, generator=generator)) for s in SHAPES]
    optimizer = torch.optim.SGD(
        parameters, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4, fused=fused
    )
    if fused:
        start_momentum_at_zero(optimizer)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    for step in range(steps):
        loss = sum(
            ((p * torch.randn(p.shape, generator=generator)).sum() for p in parameters),
            torch.zeros(()),
        )
        scaler.scale(loss).backward()
        if step in overflowing_steps:
            grad = parameters[0].grad
            assert grad is not None
            grad[0, 0, 0, 0] = float("inf")
        for shape in SHAPES:  # freed at once: NaN where a buffer from torch.empty_like lands
            torch.full(shape, float("nan"))
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    return [p.detach() for p in parameters]


@pytest.mark.parametrize("overflowing_steps", [{0}, {0, 1}, {2}, set()], ids=str)
def test_a_step_the_scaler_skips_leaves_fused_sgd_where_the_per_tensor_kernels_are(
    overflowing_steps,
):
    fused, per_tensor = train(True, overflowing_steps), train(False, overflowing_steps)
    for ours, theirs in zip(fused, per_tensor):
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
