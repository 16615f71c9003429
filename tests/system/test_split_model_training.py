"""A --model_parallel replica trained: pipelined training reaches both halves, and under DDP one
step over the split model matches the single-process reference."""

from __future__ import annotations

import socket
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from resnet50_trainer.model.resnet import (
    SplitResNet,
    build_model,
    weight_decay_groups,
)
from tests.support.small_models import CPU_PAIR, NUM_LABELS, seeded_batch, seeded_resnet18

LEARNING_RATE = 0.1
WEIGHT_DECAY = 1e-4


def _sgd(model: torch.nn.Module) -> torch.optim.SGD:
    return torch.optim.SGD(
        weight_decay_groups(model),
        lr=LEARNING_RATE,
        momentum=0.9,
        nesterov=True,
        weight_decay=WEIGHT_DECAY,
    )


def _ddp_rank(rank: int, port: int, start_file: str, result_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=60),
    )
    try:
        start = torch.load(start_file, weights_only=True)
        model = build_model(18, NUM_LABELS, 3)
        model.load_state_dict(start["weights"])
        ddp = torch.nn.parallel.DistributedDataParallel(
            SplitResNet(model, CPU_PAIR), device_ids=None
        )
        optimizer = _sgd(ddp)
        images, labels = start["images"][rank], start["labels"][rank]
        F.cross_entropy(ddp(images), labels).backward()
        optimizer.step()
        torch.save(
            {name: p.detach() for name, p in ddp.module.named_parameters()},
            result_file.format(rank=rank),
        )
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_ddp_step_over_split_model_matches_single_process_reference(tmp_path):
    weights = seeded_resnet18().state_dict()
    # 64 px: at 32 px layer4's BN sees 2 values per channel and gradients blow up to ~1e3,
    # which turns harmless summation-order differences into large ones.
    halves = [seeded_batch(size=2, pixels=64, seed=seed) for seed in (1, 2)]
    start_file = str(tmp_path / "start.pt")
    torch.save(
        {"weights": weights, "images": [h[0] for h in halves], "labels": [h[1] for h in halves]},
        start_file,
    )
    result_file = str(tmp_path / "rank{rank}.pt")
    mp.spawn(_ddp_rank, args=(_free_port(), start_file, result_file), nprocs=2, join=True)

    # Train-mode BN normalises each rank's half with that half's statistics, so the reference
    # runs each half separately and averages the two losses: exactly what DDP's gradient mean is.
    reference = build_model(18, NUM_LABELS, 3)
    reference.load_state_dict(weights)
    optimizer = _sgd(reference)
    losses = (F.cross_entropy(reference(images), labels) for images, labels in halves)
    loss = sum(losses, torch.zeros(())) / 2
    loss.backward()
    optimizer.step()

    ranks = [torch.load(result_file.format(rank=r), weights_only=True) for r in (0, 1)]
    for name, expected in reference.named_parameters():
        assert torch.equal(ranks[0][name], ranks[1][name]), name
        assert torch.allclose(ranks[0][name], expected.detach(), rtol=1e-5, atol=1e-6), name
        assert not torch.equal(ranks[0][name], weights[name]), name


def test_pipelined_training_reaches_both_halves():
    split = SplitResNet(seeded_resnet18(), CPU_PAIR, pipeline_chunks=2)
    images, labels = seeded_batch()
    logits = split(images)
    assert logits.shape == (4, NUM_LABELS)
    F.cross_entropy(logits, labels).backward()
    for name, parameter in split.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name
    parameters = dict(split.named_parameters())
    for name in ("conv1.weight", "fc.weight"):
        grad = parameters[name].grad
        assert grad is not None and grad.abs().sum() > 0, name
