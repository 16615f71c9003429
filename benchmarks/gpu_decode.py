"""`--decode_device gpu`'s cost on the training thread: per batch, the kernels launched and the time
BatchDecoder takes, on N ImageNet-like JPEGs; and what packing a batch's bytes into one tensor
saves on the way from an input process (one shared-memory tensor instead of one a record).

On CUDA (--device cuda) it counts the CUDA launches of one staged batch with torch.profiler (before
the packing and batched resize: about 8 a record) and times --batches batches. On any machine it
times passing a batch of file bytes through a torch.multiprocessing queue, as one tensor and as one
tensor a record. The launches' figures: python -m benchmarks run --only gpu_decode (on a GPU).
Usage: python -m benchmarks.gpu_decode [--device cuda] [--batch_size 256]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.multiprocessing as multiprocessing
from torch.profiler import ProfilerActivity, profile
from torchvision.io import encode_jpeg

from benchmarks.registry import LOWER, Context, Figure, benchmark
from benchmarks.train import no_gpu
from benchmarks.trees import Tree
from resnet50_trainer.data import transforms
from resnet50_trainer.data.gpu_decode import BatchDecoder, EncodedBatch

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaMemcpyAsync", "cudaLaunchKernelExC")


def jpegs(count: int, height: int = 375, width: int = 500) -> list[bytes]:
    """Smooth noise pictures of ImageNet's typical size, JPEG quality 90."""
    base = torch.rand(1, 3, height // 8, width // 8) * 255
    files = []
    for index in range(count):
        shifted = torch.roll(base, index, dims=3)
        pixels = torch.nn.functional.interpolate(shifted, (height, width), mode="bilinear")
        files.append(bytes(encode_jpeg(pixels[0].to(torch.uint8), quality=90).numpy()))
    return files


def encoded_batch(files: list[bytes], image_size: int) -> EncodedBatch:
    spans, start = [], 0
    for data in files:
        spans.append((start, start + len(data)))
        start += len(data)
    plans = [
        transforms.CropPlan((50, 40, 50 + 300, 40 + 300), index % 2 == 1)
        for index in range(len(files))
    ]
    return EncodedBatch(
        torch.frombuffer(bytearray(b"".join(files)), dtype=torch.uint8),
        spans,
        plans,
        torch.empty(0, dtype=torch.uint8),
        torch.zeros(len(files), dtype=torch.int64),
        [],
        [b"%d" % index for index in range(len(files))],
    )


def launches_and_seconds(batch: EncodedBatch, image_size: int, batches: int) -> tuple[int, float]:
    decoder = BatchDecoder(torch.device("cuda"), 3, image_size)
    decoder(batch)  # warm-up: nvJPEG's buffers, the resize kernels
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiled:
        decoder(batch)
        torch.cuda.synchronize()
    launched = sum(event.count for event in profiled.key_averages() if event.key in LAUNCHES)
    started = time.perf_counter()
    for _ in range(batches):
        decoder(batch)
    torch.cuda.synchronize()
    return launched, (time.perf_counter() - started) / batches


def _send(queue, done, tensors, count: int) -> None:
    for _ in range(count):
        queue.put(tensors)
    done.wait()  # the receiver takes the shared memory's handles from this process


def queue_seconds(tensors, count: int = 10) -> float:
    """A batch a time from a child process to this one, as a DataLoader worker sends it: the
    sender's move into shared memory and the receiver's mapping, one file a tensor."""
    context = multiprocessing.get_context("spawn")
    queue, done = context.Queue(), context.Event()
    child = context.Process(target=_send, args=(queue, done, tensors, count + 1))
    child.start()
    queue.get()  # the child's start-up, not timed
    started = time.perf_counter()
    for _ in range(count):
        queue.get()
    seconds = (time.perf_counter() - started) / count
    done.set()
    child.join()
    return seconds


def gpu_decode_figures(batch_size: int, image_size: int, batches: int) -> dict[str, float]:
    """The declared figures (in a tree's process, on its CUDA GPU)."""
    files = jpegs(batch_size)
    launched, seconds = launches_and_seconds(encoded_batch(files, image_size), image_size, batches)
    return {
        "gpu_decode_launches_per_record": launched / len(files),
        "gpu_decode_batch_ms": seconds * 1e3,
    }


@benchmark(
    "gpu_decode",
    "The GPU decode's launches (256 records, 224 px)",
    (
        Figure(
            "gpu_decode_launches_per_record",
            "launches",
            LOWER,
            None,
            0.05,
            "CUDA launches (kernels and copies) of one batch's `--decode_device gpu` decode, cut, "
            "resize and mirror (BatchDecoder), a record",
        ),
        Figure("gpu_decode_batch_ms", "ms", LOWER, None, 0.1, "BatchDecoder's time, a batch"),
    ),
    unavailable=no_gpu,
    rounds=(1, 3),
    order=55,
)
def measure_gpu_decode(context: Context, tree: Tree) -> dict[str, float]:
    return tree.call(
        "benchmarks.gpu_decode:gpu_decode_figures", batch_size=256, image_size=224, batches=20
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()
    files = jpegs(args.batch_size)
    packed = torch.frombuffer(bytearray(b"".join(files)), dtype=torch.uint8)
    apart = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in files]
    one, many = queue_seconds(packed), queue_seconds(apart)
    print(f"through a queue: one tensor {one * 1e3:.1f} ms, one a record {many * 1e3:.1f} ms")
    if args.device == "cuda":
        figures = gpu_decode_figures(args.batch_size, args.image_size, args.batches)
        print(
            f"GPU decode: {figures['gpu_decode_launches_per_record']:.2f} launches a record, "
            f"{figures['gpu_decode_batch_ms']:.1f} ms a batch"
        )


if __name__ == "__main__":
    main()
