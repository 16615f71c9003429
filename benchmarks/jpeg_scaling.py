"""What libjpeg-turbo's DCT scaling and fast modes buy on ImageNet-like JPEGs (bench_data's scenes,
quality 90), one core: milliseconds a decode at each M/8 scale, and for the fast DCT / fast
upsampling the time and the 224 px centre crop's PSNR against the accurate full decode's crop.
The evidence behind data/formats/images.py's choice of power-of-two scales and accurate modes. With
--regions, what decoding only a crop's box (data/formats/jpeg_region.py) costs against the whole
frame: the entropy decoding alone (the last row's box: every row above it is only entropy-decoded),
and the boxes of the scale crop and of random-resized crops (--image_size out), decoded in rounds
interleaved with whole frames; --photo FILE,... adds files of one's own (e.g. real photos).
Usage: python -m benchmarks.jpeg_scaling [--sizes 500x375,1000x750] [--images 20]
    [--regions] [--photo FILE,...]
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import statistics
import time

import numpy as np
import simplejpeg
import torch

from benchmarks import bench_data
from resnet50_trainer.data import transforms
from resnet50_trainer.data.formats.jpeg_region import decode_jpeg_box
from resnet50_trainer.data.settings import DEFAULT_CROP_AREA, DEFAULT_CROP_RATIO

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


def region_report(name: str, jpegs: list, args) -> None:
    """Per-decode time of each kind of box against the whole frame, as shares of it (median of
    rounds, each round's boxes timed right after its whole frames)."""
    sizes = [simplejpeg.decode_jpeg_header(jpeg)[1::-1] for jpeg in jpegs]
    boxes = {"entropy only (last row)": [(0, h - 1, w, h) for w, h in sizes]}
    plans = []
    for position, (width, height) in enumerate(sizes):
        rng = random.Random(f"0:{position}")
        plans.append(transforms.scale_plan(width, height, args.scale, args.image_size, rng, False))
    boxes["scale crop"] = [plan.crop.box for plan in plans]
    boxes["random-resized crops"] = [
        transforms.random_resized_plan(
            w, h, args.image_size, DEFAULT_CROP_AREA, DEFAULT_CROP_RATIO, random.Random(i), False
        ).crop.box
        for i, (w, h) in enumerate(sizes)
    ]
    shares: dict[str, list[float]] = {kind: [] for kind in boxes}
    whole_ms = []
    for _ in range(args.repeats):
        whole = best_ms(simplejpeg.decode_jpeg, jpegs, 1)
        whole_ms.append(whole)
        for kind, kind_boxes in boxes.items():
            started = time.perf_counter()
            for jpeg, size, box in zip(jpegs, sizes, kind_boxes):
                decode_jpeg_box(jpeg, size, 3, 1, box)
            shares[kind].append((time.perf_counter() - started) / len(jpegs) * 1e3 / whole)
    listed = "; ".join(f"{kind} {statistics.median(v):.2f}" for kind, v in shares.items())
    print(f"{name}: whole frame {statistics.median(whole_ms):.2f} ms; box / whole frame: {listed}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="500x375,1000x750")
    parser.add_argument("--images", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7, help="best of, per figure")
    parser.add_argument("--scale", type=int, default=256)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--regions", action="store_true", help="only the box decodes' costs")
    parser.add_argument("--photo", default="", help="comma-separated JPEG files, with --regions")
    args = parser.parse_args()
    print(f"simplejpeg {simplejpeg.__version__}; load {os.getloadavg()[0]:.1f}")
    rng = np.random.default_rng(0)
    for size in args.sizes.split(","):
        width, height = (int(part) for part in size.split("x"))
        jpegs = [
            bench_data.jpeg_bytes(bench_data.make_photo(rng, width, height))
            for _ in range(args.images)
        ]
        if args.regions:
            region_report(f"{width}x{height}", jpegs, args)
        else:
            report(width, height, jpegs, args)
    for path in filter(None, args.photo.split(",")):
        with open(path, "rb") as file:
            region_report(os.path.basename(path), [file.read()], args)


if __name__ == "__main__":
    main()
