"""What benchmarks/scaling_model.py is calibrated with, measured on this machine:

- DDP's real buckets of ResNet-50 (1000 classes; DDP's default 25 MB cap, after its rebuild at the
  second step), in the order they are all-reduced;
- when each bucket's gradients are ready, as a fraction of the backward pass (a communication
  hook that records the time and sends nothing, one process, one thread), and the forward pass's
  share of a step;
- Gloo's all-reduce bandwidth between 2 processes (25 MB float32, DDP's bucket size), on loopback
  and between two machines of network namespaces (benchmarks/network_namespaces.py; where they
  can be made).

Run: python -m benchmarks.scaling_calibration OUT.json (a few minutes on 2 cores); its figures
(what docs/scaling.md quotes of them): python -m benchmarks run --only scaling_calibration."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel

from benchmarks.network_namespaces import (
    Place,
    free_port,
    join_gloo_group,
    namespaces_unavailable,
    seated,
)
from benchmarks.registry import HIGHER, LOWER, Context, Figure, benchmark
from benchmarks.trees import BENCHMARKS_ROOT, Tree

BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb
STEPS = 4  # the first 2 build and rebuild DDP's buckets


def _ready_times(times: list[tuple[int, int, float]]):
    # Unannotated: DDP compares annotations with the classes, and here they would be strings.
    def hook(_, bucket):
        times.append((bucket.index(), bucket.buffer().numel(), time.perf_counter()))
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    return hook


def buckets_and_backward(image_size: int, batch: int) -> dict:
    """DDP's buckets of ResNet-50 and when each is ready, in one process (DDP's buckets do not
    depend on the number of processes)."""
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    ddp = DistributedDataParallel(torchvision.models.resnet50(), gradient_as_bucket_view=True)
    times: list[tuple[int, int, float]] = []
    ddp.register_comm_hook(None, _ready_times(times))
    images, labels = torch.randn(batch, 3, image_size, image_size), torch.zeros(batch).long()
    forward_shares, ready_fractions = [], []
    for step in range(STEPS):
        times.clear()
        started = time.perf_counter()
        loss = F.cross_entropy(ddp(images), labels)
        backward_started = time.perf_counter()
        loss.backward()
        ended = time.perf_counter()
        if step >= 2:
            forward_shares.append((backward_started - started) / (ended - started))
            ready_fractions.append(
                [(at - backward_started) / (ended - backward_started) for _, _, at in times]
            )
    dist.destroy_process_group()
    return {
        "bucket_elements": [elements for _, elements, _ in times],
        "bucket_ready_fraction": [round(statistics.mean(f), 4) for f in zip(*ready_fractions)],
        "forward_share": round(statistics.mean(forward_shares), 4),
    }


def _time_all_reduce(rank: int, seats: list[Place], port: int, repeats: int, results) -> None:
    join_gloo_group(seats, rank, port)
    torch.set_num_threads(1)
    tensor = torch.ones(BUCKET_BYTES // 4)
    dist.all_reduce(tensor)  # connections made
    seconds = []
    for _ in range(repeats):
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(tensor)
        seconds.append(time.perf_counter() - started)
    if rank == 0:
        results.put(statistics.median(seconds))
    dist.destroy_process_group()


def gloo_bus_gbps(on_machines: bool, repeats: int = 10) -> float:
    """Bus bandwidth (bytes each process sends: 2(N-1)/N x size, = size at N = 2) in Gb/s, on
    loopback or between two namespace machines."""
    results = mp.get_context("spawn").SimpleQueue()
    with seated(2, on_machines) as seats:
        mp.spawn(_time_all_reduce, (seats, free_port(), repeats, results), nprocs=2)
    return round(BUCKET_BYTES * 8 / results.get() / 1e9, 2)


def namespaces_gbps() -> float | None:
    """Gloo's bus bandwidth between two machines of network namespaces; None where they cannot be
    made (not root)."""
    return gloo_bus_gbps(on_machines=True) if namespaces_unavailable() is None else None


def calibration_figures(image_size: int, batch: int) -> dict[str, float]:
    """The declared figures (in a fresh process): the forward's share of a step, the gradient
    bytes ready within the first half of the backward pass, Gloo's bandwidths."""
    measured = buckets_and_backward(image_size, batch)
    elements, ready = measured["bucket_elements"], measured["bucket_ready_fraction"]
    early = sum(size for size, at in zip(elements, ready) if at <= 0.5) / sum(elements)
    figures = {
        "forward_share_of_step": measured["forward_share"],
        "bytes_ready_by_half_backward": early,
        "gloo_loopback_bus_gbps": gloo_bus_gbps(on_machines=False),
    }
    between = namespaces_gbps()
    return figures if between is None else {**figures, "gloo_namespaces_bus_gbps": between}


@benchmark(
    "scaling_calibration",
    "The scaling model's inputs, CPU (ResNet-50, 224 px, 4 images)",
    (
        Figure(
            "forward_share_of_step",
            "share",
            LOWER,
            None,
            0.1,
            "the forward pass's share of a step of ResNet-50 under DDP, one process and thread",
        ),
        Figure(
            "bytes_ready_by_half_backward",
            "share",
            HIGHER,
            None,
            0.05,
            "the share of DDP's gradient bytes whose bucket is ready within the first half of the "
            "backward pass (a hook that records the time and sends nothing)",
        ),
        Figure(
            "gloo_loopback_bus_gbps",
            "Gb/s",
            HIGHER,
            None,
            0.3,
            "Gloo's all-reduce of 25 MB between 2 processes on loopback, bus bandwidth",
        ),
        Figure(
            "gloo_namespaces_bus_gbps",
            "Gb/s",
            HIGHER,
            None,
            0.2,
            "the same between two machines of network namespaces (veth pairs and a bridge; root)",
        ),
    ),
    rounds=(1, 3),
    order=72,
)
def measure_calibration(context: Context, tree: Tree) -> dict[str, float]:
    # Torch's and the machine's figures, not the trainer's: this package's code in either tree.
    this = Tree("this", BENCHMARKS_ROOT)
    return this.call("benchmarks.scaling_calibration:calibration_figures", image_size=224, batch=4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", help="JSON file to write")
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args()
    calibration = {
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, torch {torch.__version__}",
        "load_average_at_start": round(os.getloadavg()[0], 2),
        "image_size": args.image_size,
        "batch": args.batch,
        **buckets_and_backward(args.image_size, args.batch),
        "gloo_loopback_bus_gbps": gloo_bus_gbps(on_machines=False),
        "gloo_namespaces_bus_gbps": namespaces_gbps(),
    }
    with open(args.output, "w") as file:
        json.dump(calibration, file, indent=1)
    print(json.dumps(calibration))


if __name__ == "__main__":
    main()
