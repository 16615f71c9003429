"""Input pipeline: ours (`resnet50-db bench`'s pipeline) against torchvision's ImageFolder pipeline
as PyTorch's ImageNet example builds it, over the same ImageNet-like JPEGs, in one invocation.

Baseline: ImageFolder (Pillow open + convert RGB), RandomResizedCrop(224), RandomHorizontalFlip,
ToTensor, Normalize, DataLoader(shuffle=True). Ours: LMDB of Datum records holding the same JPEG
bytes, uint8 crops (shorter side 256, random 224 crop, mirror), normalisation left to the device.
Both are timed the same way: one warm-up batch (input processes start), then --batches batches;
the best of --repeats runs is kept (the machine may be shared). Per core: images/s divided by
max(1, workers). `--crops scale,random_resized` times ours once per training crop (random_resized:
the baseline's RandomResizedCrop, planned per position and decoded at a reduced DCT scale where the
box allows it). Usage: python scripts/benchmark_input.py [--workers 0,2] [--crops C,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_data  # noqa: E402

from resnet50_trainer.tools.db import bench  # noqa: E402

IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def baseline_rate(root: str, batch_size: int, batches: int, workers: int, image_size: int) -> float:
    dataset = datasets.ImageFolder(
        root,
        transforms.Compose(
            [
                transforms.RandomResizedCrop(image_size),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
            ]
        ),
    )
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        num_workers=workers,
        pin_memory=torch.cuda.is_available(),
        drop_last=True,
    )
    iterator = iter(loader)
    next(iterator)
    started = time.perf_counter()
    images = sum(len(target) for _, target in (next(iterator) for _ in range(batches)))
    return images / (time.perf_counter() - started)


def ours_rate(
    lmdb_path: str, batch_size: int, batches: int, workers: int, image_size: int, crop: str
) -> float:
    args = argparse.Namespace(
        db=lmdb_path,
        db_type="lmdb",
        batch_size=batch_size,
        image_size=image_size,
        scale=None,
        crop=crop,
        num_channels=3,
        num_workers=workers,
        batches=batches,
        device="cpu",
        decode_device="cpu",
        seed=0,
    )
    return bench.bench(args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "resnet50_bench_data"))
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument(
        "--batches", type=int, default=7, help="timed batches (images >= (batches+1) x batch)"
    )
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--workers", default="0,2", help="comma-separated input process counts")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--crops", default="scale", help="comma-separated training crops of ours")
    args = parser.parse_args()
    if args.images < (args.batches + 1) * args.batch_size:
        parser.error("--images must hold the warm-up batch and --batches batches")
    root, lmdb_path = bench_data.build(args.out, args.images)
    print(
        f"data: {bench_data.describe(root)}; {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}"
    )
    torch.set_num_threads(1)  # as in DataLoader workers: one core per decoding process
    for workers in (int(part) for part in args.workers.split(",")):
        cores = max(1, workers)
        base = max(
            baseline_rate(root, args.batch_size, args.batches, workers, args.image_size)
            for _ in range(args.repeats)
        )
        print(f"workers {workers}: baseline {base:.1f} images/s ({base / cores:.1f} per core)")
        for crop in args.crops.split(","):
            ours = max(
                ours_rate(lmdb_path, args.batch_size, args.batches, workers, args.image_size, crop)
                for _ in range(args.repeats)
            )
            print(
                f"workers {workers}: ours --crop {crop} {ours:.1f} images/s "
                f"({ours / cores:.1f} per core), ratio {ours / base:.2f}x"
            )


if __name__ == "__main__":
    main()
