"""What libjpeg-turbo's DCT scaling and fast modes buy on ImageNet-like JPEGs (bench_data's scenes,
quality 90), one core: milliseconds a decode at each M/8 scale, and for the fast DCT / fast
upsampling the time and the 224 px centre crop's PSNR against the accurate full decode's crop.
The evidence behind data/records.py's choice of power-of-two scales and accurate modes.
Usage: python scripts/benchmark_jpeg_scaling.py [--sizes 500x375,1000x750] [--images 20]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import numpy as np
import simplejpeg
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_data  # noqa: E402

from resnet50_trainer.data import transforms  # noqa: E402

FAST_MODES = {
    "accurate": {},
    "fastdct": {"fastdct": True},
    "fastupsample": {"fastupsample": True},
    "both fast": {"fastdct": True, "fastupsample": True},
}


def best_ms(decode, jpegs: list, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for jpeg in jpegs:
            decode(jpeg)
        best = min(best, (time.perf_counter() - started) / len(jpegs))
    return best * 1e3


def centre_crop(pixels: np.ndarray, scale: int, size: int) -> torch.Tensor:
    image = torch.from_numpy(pixels).permute(2, 0, 1)
    plan = transforms.centre_plan(image.shape[2], image.shape[1], scale, size)
    return transforms.resize_crop(image, plan, size).float()


def psnr(crop: torch.Tensor, reference: torch.Tensor) -> float:
    mse = float(((crop - reference) ** 2).mean())
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


def report(width: int, height: int, jpegs: list, args) -> None:
    timings = []
    for eighths in range(8, 0, -1):  # min_height = the height at M/8 makes simplejpeg pick M/8
        rows = -(-height * eighths // 8)
        ms = best_ms(
            functools.partial(simplejpeg.decode_jpeg, min_height=rows, min_width=1),
            jpegs,
            args.repeats,
        )
        timings.append(f"{eighths}/8 {ms:.2f}")
    print(f"{width}x{height} ms a decode at each scale: " + " | ".join(timings))
    references = [
        centre_crop(simplejpeg.decode_jpeg(j), args.scale, args.image_size) for j in jpegs
    ]
    for name, options in FAST_MODES.items():
        ms = best_ms(functools.partial(simplejpeg.decode_jpeg, **options), jpegs, args.repeats)
        quality = min(
            psnr(
                centre_crop(simplejpeg.decode_jpeg(j, **options), args.scale, args.image_size),
                reference,
            )
            for j, reference in zip(jpegs, references)
        )
        print(f"{width}x{height} full size, {name}: {ms:.3f} ms, worst crop PSNR {quality:.1f} dB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="500x375,1000x750")
    parser.add_argument("--images", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7, help="best of, per figure")
    parser.add_argument("--scale", type=int, default=256)
    parser.add_argument("--image_size", type=int, default=224)
    args = parser.parse_args()
    print(f"simplejpeg {simplejpeg.__version__}; load {os.getloadavg()[0]:.1f}")
    rng = np.random.default_rng(0)
    for size in args.sizes.split(","):
        width, height = (int(part) for part in size.split("x"))
        jpegs = [
            bench_data.jpeg_bytes(bench_data.make_photo(rng, width, height))
            for _ in range(args.images)
        ]
        report(width, height, jpegs, args)


if __name__ == "__main__":
    main()
