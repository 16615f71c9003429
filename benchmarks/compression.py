"""Gradient compression measured: the bytes each process hands to the all-reduce per step, and
images/s, for --grad_compression none, fp16, bf16 and powersgd, 2 processes on Gloo.

Each mode, in turn (--repeats rounds of all modes, interleaved): 2 processes meet on a TCPStore,
on loopback (--network loopback) or as two machines, each in its own network namespace with its
own address and interface joined by a bridge (--network namespaces:
benchmarks/network_namespaces.py, needs root), build the trainer's own replica
(replica.build_replica: the model, DDP and the mode's communication hook) from the trainer's
flags, run --warmup steps (past --powersgd_start_iter, so PowerSGD compresses while timed) and then
--steps timed steps of forward, loss, backward and SGD step on synthetic images.

Bytes: every tensor a hook hands to torch.distributed.all_reduce is counted, by a pass-through
wrapper in the benchmark's own processes. `none` registers no hook: DDP's C++ all-reduce then sends
every gradient once in float32, 4 bytes a parameter, which is what the table says for it. On the
wire a ring all-reduce moves 2(N-1)/N of the payload in and out of each process.

Its figures (between namespaces, as root): python -m benchmarks run --only compression. Alone:
python -m benchmarks.compression [--network namespaces --num_layers 50 --image_size 64
--batch_size 16 --steps 10 --repeats 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from benchmarks.network_namespaces import (
    Place,
    free_port,
    join_gloo_group,
    namespaces_unavailable,
    seated,
)
from benchmarks.registry import HIGHER, Context, Figure, benchmark
from benchmarks.trees import Tree
from resnet50_trainer.cli import build_parser, config_from_args
from resnet50_trainer.config.flags.distributed import GRAD_COMPRESSIONS
from resnet50_trainer.config.settings import Config
from resnet50_trainer.model.replica import build_replica

PROCESSES = 2
POWERSGD_START = 2  # the least PowerSGD takes: the timed steps all compress
COMPRESSED = ("fp16", "bf16", "powersgd")  # the modes set against none


def trainer_config(args: argparse.Namespace, mode: str) -> Config:
    flags = [
        *("--train_data", "null", "--use_cpu", "--num_gpus", str(PROCESSES)),
        *("--num_layers", str(args.num_layers), "--image_size", str(args.image_size)),
        *("--batch_size", str(args.batch_size), "--grad_compression", mode),
    ]
    if mode == "powersgd":
        flags += ["--powersgd_rank", str(args.rank), "--powersgd_start_iter", str(POWERSGD_START)]
    return config_from_args(build_parser().parse_args(flags), gpus_present=0)


def count_all_reduce_bytes() -> list[int]:
    """Wrap torch.distributed.all_reduce (as the hooks call it) to add up the bytes handed to it."""
    counted = [0]
    all_reduce = dist.all_reduce

    def counting(tensor: torch.Tensor, *args, **kwargs):
        counted[0] += tensor.numel() * tensor.element_size()
        return all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = counting
    return counted


def measure(
    rank: int, args: argparse.Namespace, mode: str, seats: list[Place], port: int, results
) -> None:
    join_gloo_group(seats, rank, port)
    torch.set_num_threads(max(1, (os.cpu_count() or PROCESSES) // PROCESSES))
    config = trainer_config(args, mode)
    replica = build_replica(config, rank, torch.device("cpu"))
    counted = count_all_reduce_bytes()
    generator = torch.Generator().manual_seed(rank)
    per_process = config.device_batch_size
    images = torch.randn(per_process, 3, args.image_size, args.image_size, generator=generator)
    labels = torch.randint(0, config.num_labels, (per_process,), generator=generator)
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            dist.barrier()
            counted[0], started = 0, time.perf_counter()
        replica.optimizer.zero_grad(set_to_none=True)
        F.cross_entropy(replica.train_model(images), labels).backward()
        replica.optimizer.step()
    dist.barrier()
    seconds = time.perf_counter() - started
    if rank == 0:
        parameters = sum(p.numel() for p in replica.model.parameters())
        payload = counted[0] / args.steps if mode != "none" else 4 * parameters
        results.put((mode, payload, config.global_batch_size * args.steps / seconds))
    dist.destroy_process_group()


def options() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--network", choices=("loopback", "namespaces"), default="loopback")
    parser.add_argument("--num_layers", type=int, default=50)
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=16, help="global, over the 2 processes")
    parser.add_argument("--rank", type=int, default=2, help="--powersgd_rank")
    parser.add_argument("--warmup", type=int, default=POWERSGD_START + 3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--modes", default=",".join(GRAD_COMPRESSIONS))
    return parser


def measured_modes(args: argparse.Namespace, say: Callable[[str], None]) -> list[tuple]:
    """(mode, bytes handed to the all-reduce a step, images/s) of each mode, --repeats rounds of
    all modes, interleaved; `say` hears each as it is measured."""
    results = mp.get_context("spawn").SimpleQueue()
    rows = []
    with seated(PROCESSES, on_machines=args.network == "namespaces") as seats:
        where = ", ".join(
            f"rank {rank} on {seat.interface} {seat.address}" for rank, seat in enumerate(seats)
        )
        say(f"{args.network}: {where}; the store at {seats[0].store_address}")
        for _ in range(args.repeats):
            for mode in args.modes.split(","):
                # Spawned: in a tree's process (python -m benchmarks compare) the children import
                # this package from that tree's checkout.
                mp.spawn(measure, (args, mode, seats, free_port(), results), nprocs=PROCESSES)
                rows.append(results.get())
                mb, rate = rows[-1][1] / 1e6, rows[-1][2]
                say(f"{rows[-1][0]}: {mb:.3f} MB a step, {rate:.2f} images/s")
    return rows


def compression_figures(network: str) -> dict[str, float]:
    """The declared figures: one round of every mode (in a tree's process)."""
    args = options().parse_args(["--network", network, "--repeats", "1"])
    rows = {mode: (payload, rate) for mode, payload, rate in measured_modes(args, lambda _: None)}
    (none_bytes, none_rate), (powersgd_bytes, _) = rows["none"], rows["powersgd"]
    figures = {f"compression_{mode}_vs_none": rows[mode][1] / none_rate for mode in COMPRESSED}
    return {**figures, "compression_powersgd_bytes_vs_none": none_bytes / powersgd_bytes}


@benchmark(
    "compression",
    "Gradient compression, 2 Gloo processes between network namespaces",
    (
        *(
            Figure(
                f"compression_{mode}_vs_none",
                "x",
                HIGHER,
                None,
                0.1,
                f"images/s with `--grad_compression {mode}` over `none`'s: ResNet-50, 64 px, "
                "16 images a step, 2 processes each on a machine of network namespaces",
            )
            for mode in COMPRESSED
        ),
        Figure(
            "compression_powersgd_bytes_vs_none",
            "x",
            HIGHER,
            None,
            0.01,
            "bytes a process hands to the all-reduce a step: `none`'s (float32) over PowerSGD's "
            "at rank 2",
        ),
    ),
    unavailable=namespaces_unavailable,
    rounds=(1, 3),
    order=70,
)
def measure_compression(context: Context, tree: Tree) -> dict[str, float]:
    return tree.call("benchmarks.compression:compression_figures", network="namespaces")


def main() -> None:
    parser = options()
    args = parser.parse_args()
    unknown = set(args.modes.split(",")) - set(GRAD_COMPRESSIONS)
    if unknown:
        parser.error(
            f"--modes: {', '.join(sorted(unknown))} not among {', '.join(GRAD_COMPRESSIONS)}"
        )
    if args.network == "namespaces" and (reason := namespaces_unavailable()):
        sys.exit(f"benchmarks.compression: {reason}")
    print(f"load average at start: {os.getloadavg()[0]:.2f}; torch {torch.__version__}")
    rows = measured_modes(args, print)
    baseline = {payload: rate for mode, payload, rate in rows if mode == "none"}
    none_payload = next(iter(baseline), None)
    none_rate = sum(baseline.values()) / len(baseline) if baseline else None
    print(
        "\n| mode | MB handed to all-reduce per step, each process | none's bytes / these "
        "| images/s | images/s / none's (mean) |"
    )
    print("|---|---|---|---|---|")
    for mode, payload, rate in rows:
        bytes_ratio = f"{none_payload / payload:.1f}" if none_payload else "-"
        rate_ratio = f"{rate / none_rate:.2f}x" if none_rate else "-"
        print(f"| {mode} | {payload / 1e6:.3f} | {bytes_ratio} | {rate:.2f} | {rate_ratio} |")


if __name__ == "__main__":
    main()
