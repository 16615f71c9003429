"""What the trainer's step costs the host beyond the model's own: `resnet50-trainer --train_data
null`'s steady-state step time against a bare loop of the same model (forward, loss, backward, SGD
step; nothing else), both on one core with one thread.

The model is ResNet-50's structure with bottlenecks one channel wide (--resnext_width_per_group 1)
at 32 px and 2 images a step: the arithmetic is small, so what either loop spends per layer and per
parameter in Python and in PyTorch's dispatch is most of a step, as it is of a fast GPU's step
(where the host must queue a step's ~1,000 kernels in the step's ~30 ms). A per-step cost the
trainer adds (a sync, a Python loop over the parameters, a tensor op per step) shows here on any
machine. Each side's step is that of its fastest 20 steps of 200 (the trainer's console lines give
each 20's rate): another process on the core slows some intervals, rarely all of them, where a
mean over the window swung 0.5-1.5x on this 2-core machine under load. A per-step cost slows every
interval. Usage: python -m benchmarks run --only step_overhead (or compare).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time

import torch
import torch.nn.functional as F
import torchvision

from benchmarks.registry import LOWER, Context, Figure, benchmark
from benchmarks.train import PRINT_EVERY, interval_rates
from benchmarks.trees import MeasurementFailed, Tree

IMAGES, PIXELS, LABELS, WIDTH = 2, 32, 10, 1  # a step's batch, its side, the classes, the width
UNTIMED, TIMED = 20, 200  # steps: the window starts on a console line (PRINT_EVERY)
LEARNING_RATE, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 1e-4  # the trainer's defaults


def one_core() -> int:
    """The core both loops are pinned to: the last this process may use."""
    return max(os.sched_getaffinity(0))


def bare_loop_step_ms(core: int, timed: int = TIMED) -> float:
    """Milliseconds a step of the bare loop's fastest PRINT_EVERY steps of `timed` after UNTIMED,
    on `core` alone (runs in a tree's process)."""
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torchvision.models.resnet50(width_per_group=WIDTH, num_classes=LABELS)
    optimizer = torch.optim.SGD(
        model.parameters(),
        LEARNING_RATE,
        momentum=MOMENTUM,
        nesterov=True,
        weight_decay=WEIGHT_DECAY,
    )
    images = torch.randn(IMAGES, 3, PIXELS, PIXELS)
    labels = torch.randint(0, LABELS, (IMAGES,))
    model.train()
    intervals = []
    for step in range(UNTIMED + timed + 1):
        if step >= UNTIMED and (step - UNTIMED) % PRINT_EVERY == 0:
            intervals.append(time.perf_counter())
        if step == UNTIMED + timed:
            break
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return min(end - start for start, end in zip(intervals, intervals[1:])) / PRINT_EVERY * 1e3


def trainer_step_ms(tree: Tree, core: int, scratch: str, timed: int = TIMED) -> float:
    """Milliseconds a step of `tree`'s trainer in its fastest PRINT_EVERY steps of `timed` after
    UNTIMED (its console lines give each interval's rate), on `core` alone."""
    with tempfile.TemporaryDirectory(dir=scratch) as out:
        flags = ["--train_data", "null", "--use_cpu", "--num_layers", "50"]
        flags += ["--resnext_width_per_group", str(WIDTH), "--image_size", str(PIXELS)]
        flags += ["--batch_size", str(IMAGES), "--num_labels", str(LABELS), "--num_epochs", "1"]
        flags += ["--epoch_size", str((UNTIMED + timed) * IMAGES), "--print_every"]
        flags += [str(PRINT_EVERY), "--log_dir", out, "--checkpoint_dir", out]
        run = subprocess.run(
            tree.trainer(flags),
            cwd=out,
            capture_output=True,
            text=True,
            env={**tree.environment(), "OMP_NUM_THREADS": "1"},
            preexec_fn=lambda: os.sched_setaffinity(0, {core}),
        )
    if run.returncode:
        raise MeasurementFailed(
            f"resnet50-trainer failed ({run.returncode}):\n{run.stderr[-3000:]}"
        )
    fastest = max(rate for _, rate in interval_rates(run.stderr + run.stdout, UNTIMED))
    return IMAGES / fastest * 1e3


@benchmark(
    "step_overhead",
    "The host's cost of a step, CPU",
    (
        Figure(
            "step_overhead_vs_bare_loop",
            "x",
            LOWER,
            1.10,
            0.05,
            "the trainer's steady-state step (`--train_data null`) over a bare loop's (forward, "
            "loss, backward, SGD step) of the same model, where the arithmetic is small: "
            "ResNet-50 with one-channel-wide bottlenecks, 32 px, 2 images, one core and thread",
            quick=True,
        ),
        Figure("step_trainer_ms", "ms", LOWER, None, 0.1, "ours, a step, as above"),
        Figure("step_bare_loop_ms", "ms", LOWER, None, 0.1, "the bare loop, a step"),
    ),
    order=60,
)
def measure_step_overhead(context: Context, tree: Tree) -> dict[str, float]:
    return step_figures(tree, str(context.scratch))


def step_figures(tree: Tree, scratch: str, timed: int = TIMED) -> dict[str, float]:
    """The figures, each loop timed over `timed` steps."""
    core = one_core()
    bare = float(
        tree.call("benchmarks.step_overhead:bare_loop_step_ms", threads=1, core=core, timed=timed)
    )
    ours = trainer_step_ms(tree, core, scratch, timed)
    return {
        "step_overhead_vs_bare_loop": ours / bare,
        "step_trainer_ms": ours,
        "step_bare_loop_ms": bare,
    }
