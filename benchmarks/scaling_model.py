"""A scaling model of data-parallel ResNet-50: DDP's ring all-reduce of each gradient bucket,
overlapped with the backward pass, on N GPUs over links of B Gb/s (docs/scaling.md).

Per step, on one GPU: forward, then backward; bucket k's gradients are ready at
  forward + f_k x backward
(f_k measured: benchmarks/scaling_calibration.py). Buckets are all-reduced one after the other, each
as soon as it is ready and the previous one is done; a ring all-reduce of S bytes over N GPUs takes
  2 (N - 1) x latency + 2 (N - 1) / N x S / (efficiency x B).
The step ends when the backward pass and the last all-reduce have. Scaling efficiency (weak
scaling, a fixed batch per GPU) = the step on one GPU / the step on N.

Calibration: the bucket sizes and f_k of ResNet-50 under DDP, and the forward's share of a step,
measured on this machine's CPU (CALIBRATION below, or --calibration FILE); the step time of one
GPU from NVIDIA's published images/s (GPUS below). Usage: python -m benchmarks.scaling_model
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TypedDict


class Calibration(TypedDict):
    """What the model takes of benchmarks/scaling_calibration.py's JSON."""

    bucket_elements: list[int]  # DDP's buckets, in the order they are all-reduced
    bucket_ready_fraction: list[float]  # when each is ready, a fraction of the backward pass
    forward_share: float  # the forward pass's share of a step


# benchmarks/scaling_calibration.py, 2026-11-23 07:05 UTC, this 2-core CPU machine, ResNet-50 at
# 224 px, 4 images (docs/speed.md, "The scaling model").
CALIBRATION: Calibration = {
    "bucket_elements": [2049000, 7875584, 6563840, 6637568, 2431040],
    "bucket_ready_fraction": [0.005, 0.1004, 0.1875, 0.4702, 0.9994],
    "forward_share": 0.3642,
}


@dataclass(frozen=True)
class Gpu:
    name: str
    images_per_second: float  # one GPU, no communication
    batch: int  # images per GPU per step
    source: str

    @property
    def step_seconds(self) -> float:
        return self.batch / self.images_per_second


# NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5 README, "Training performance results"
# (pytorch-21.03 container), 1 GPU; batch 256 a GPU is its default (-b 256).
DLE = "NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md"
GPUS = (
    Gpu("V100 16GB, mixed precision", 1200, 256, DLE),
    Gpu("A100 80GB, TF32", 938, 256, DLE),
    Gpu("A100 80GB, mixed precision", 2470, 256, DLE),
)
GRADIENT_BYTES = {"fp32": 4, "bf16": 2}  # --grad_compression none, bf16
GPU_COUNTS = (8, 16, 64, 256)
LINKS_GBPS = (25, 100, 200, 400)


@dataclass(frozen=True)
class Network:
    gbps: float  # each GPU's link in the ring
    efficiency: float = 0.85  # share of the line rate a ring all-reduce achieves
    latency_s: float = 5e-6  # each of the ring's 2 (N - 1) steps

    def all_reduce_seconds(self, size_bytes: float, gpus: int) -> float:
        if gpus == 1:
            return 0.0
        bandwidth = self.efficiency * self.gbps * 1e9 / 8
        steps = 2 * (gpus - 1)
        return steps * self.latency_s + steps / gpus * size_bytes / bandwidth


def step_seconds(
    gpu: Gpu, gpus: int, network: Network, element_bytes: int, calibration: Calibration
) -> float:
    """One step on each of `gpus` GPUs: the backward pass and the bucket all-reduces overlapped."""
    forward = calibration["forward_share"] * gpu.step_seconds
    backward = gpu.step_seconds - forward
    communicated = forward
    for elements, ready in zip(
        calibration["bucket_elements"], calibration["bucket_ready_fraction"]
    ):
        start = max(forward + ready * backward, communicated)
        communicated = start + network.all_reduce_seconds(elements * element_bytes, gpus)
    return max(gpu.step_seconds, communicated)


def efficiency(
    gpu: Gpu, gpus: int, network: Network, element_bytes: int, calibration: Calibration
) -> float:
    return gpu.step_seconds / step_seconds(gpu, gpus, network, element_bytes, calibration)


def table(
    calibration: Calibration, network: Network, gpus_measured: Sequence[Gpu] = GPUS
) -> list[str]:
    """Markdown rows: scaling efficiency for each GPU, gradient dtype, GPU count and link speed."""
    head = "| GPU (1-GPU images/s, batch) | gradients | GPUs | " + " | ".join(
        f"{gbps} Gb/s" for gbps in LINKS_GBPS
    )
    lines = [head + " |", "|---|---|---|" + "---|" * len(LINKS_GBPS)]
    for gpu in gpus_measured:
        for dtype, element_bytes in GRADIENT_BYTES.items():
            for gpus in GPU_COUNTS:
                cells = [
                    efficiency(
                        gpu,
                        gpus,
                        Network(gbps, network.efficiency, network.latency_s),
                        element_bytes,
                        calibration,
                    )
                    for gbps in LINKS_GBPS
                ]
                label = f"{gpu.name} ({gpu.images_per_second:g}, {gpu.batch})"
                lines.append(
                    f"| {label} | {dtype} | {gpus} | "
                    + " | ".join(f"{100 * cell:.0f}%" for cell in cells)
                    + " |"
                )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calibration", help="JSON of benchmarks/scaling_calibration.py")
    parser.add_argument("--link_efficiency", type=float, default=Network(0).efficiency)
    parser.add_argument("--latency_us", type=float, default=Network(0).latency_s * 1e6)
    parser.add_argument(
        "--batch",
        type=int,
        help="images per GPU per step instead of the published runs' 256, at the same images/s "
        "(optimistic for the GPU: small batches run below its peak)",
    )
    args = parser.parse_args()
    calibration: Calibration = CALIBRATION
    if args.calibration:
        with open(args.calibration) as file:
            calibration = json.load(file)
    network = Network(0, args.link_efficiency, args.latency_us * 1e-6)
    megabytes = sum(calibration["bucket_elements"]) * 4 / 1e6
    print(
        f"ResNet-50: {len(calibration['bucket_elements'])} DDP buckets, {megabytes:.1f} MB of "
        f"float32 gradients; forward {calibration['forward_share']:.0%} of a step; ring "
        f"all-reduce at {network.efficiency:.0%} of the line rate, {network.latency_s * 1e6:g} us "
        "a ring step\n"
    )
    gpus = GPUS if args.batch is None else [replace(gpu, batch=args.batch) for gpu in GPUS]
    print("\n".join(table(calibration, network, gpus)))


if __name__ == "__main__":
    main()
