"""What DistributedDataParallel costs at one process on the CPU, where its all-reduce has nothing
to add: the synthetic step loop of benchmarks/train.py (forward, loss, backward, SGD step) with
and without DDP, alternated, the round of median ratio kept (train.ddp_cost). Torch's figure, not
the trainer's (a run of one process trains without DDP): this package's code in either tree.
Run: python -m benchmarks run --only ddp_cost"""

from __future__ import annotations

import argparse

from benchmarks.registry import LOWER, Context, Figure, benchmark
from benchmarks.trees import BENCHMARKS_ROOT, Tree

# ResNet-18 at 64 px, 16 images a step: train.py's small CPU run.
LOOP = {"num_layers": 18, "image_size": 64, "batch_size": 16, "warmup": 5, "baseline_steps": 10}


def ddp_cost_share(rounds: int) -> float:
    """A step's time with DDP over without, less 1 (in a fresh process)."""
    import torch

    from benchmarks.train import ddp_cost

    without, wrapped = ddp_cost(argparse.Namespace(**LOOP, ddp_rounds=rounds), torch.device("cpu"))
    return without / wrapped - 1


@benchmark(
    "ddp_cost",
    "DDP at one process, CPU",
    (
        Figure(
            "ddp_one_process_cost",
            "share",
            LOWER,
            0.02,
            0.3,
            "a step of ResNet-18 (64 px, 16 images) with DistributedDataParallel at one process "
            "(Gloo) over the same step without it, less 1: bucketing, dividing and copying "
            "gradients that have no peer",
            floor=0.03,
        ),
    ),
    rounds=(1, 3),
    order=65,
)
def measure_ddp_cost(context: Context, tree: Tree) -> dict[str, float]:
    this = Tree("this", BENCHMARKS_ROOT)
    share = this.call("benchmarks.ddp_cost:ddp_cost_share", rounds=5)
    return {"ddp_one_process_cost": float(share)}
