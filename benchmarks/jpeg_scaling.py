"""What libjpeg-turbo's DCT scaling and fast modes buy on ImageNet-like JPEGs (bench_data's scenes,
quality 90), one core: milliseconds a decode at each M/8 scale, and for the fast DCT / fast
upsampling the time and the 224 px centre crop's PSNR against the accurate full decode's crop.
The evidence behind data/formats/images.py's choice of power-of-two scales and accurate modes. With
--regions, what decoding only a crop's box (data/formats/jpeg_region.py) costs against the whole
frame: the entropy decoding alone (the last row's box: every row above it is only entropy-decoded),
and the boxes of the scale crop and of random-resized crops (--image_size out), decoded in rounds
interleaved with whole frames; --photo FILE,... adds files of one's own (e.g. real photos).
Its figures (500x375 scenes, and the photographs' entropy share): python -m benchmarks run --only
jpeg_scaling. Alone: python -m benchmarks.jpeg_scaling [--sizes 500x375,1000x750] [--images 20]
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
from benchmarks.input_pipeline import photo_sets, prepare_photo_sets
from benchmarks.registry import HIGHER, LOWER, Context, Figure, benchmark
from benchmarks.stages import SCALE, SIZE
from benchmarks.trees import Tree
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
    return float("inf") if mse == 0 else float(10 * np.log10(255**2 / mse))


def scale_ms(jpegs: list, height: int, repeats: int) -> dict[int, float]:
    """Milliseconds a decode at each scale M/8, by M (min_height, the height at M/8, makes
    simplejpeg pick M/8)."""
    return {
        eighths: best_ms(
            functools.partial(
                simplejpeg.decode_jpeg, min_height=-(-height * eighths // 8), min_width=1
            ),
            jpegs,
            repeats,
        )
        for eighths in range(8, 0, -1)
    }


def fast_modes(jpegs: list, scale: int, size: int, repeats: int) -> dict[str, tuple[float, float]]:
    """Each mode of FAST_MODES: (milliseconds a full-size decode, the worst centre crop's PSNR
    against the accurate decode's crop)."""
    references = [centre_crop(simplejpeg.decode_jpeg(j), scale, size) for j in jpegs]
    modes = {}
    for name, options in FAST_MODES.items():
        ms = best_ms(functools.partial(simplejpeg.decode_jpeg, **options), jpegs, repeats)
        quality = min(
            psnr(centre_crop(simplejpeg.decode_jpeg(j, **options), scale, size), reference)
            for j, reference in zip(jpegs, references)
        )
        modes[name] = (ms, quality)
    return modes


def report(width: int, height: int, jpegs: list, args) -> None:
    timings = scale_ms(jpegs, height, args.repeats)
    listed = " | ".join(f"{eighths}/8 {ms:.2f}" for eighths, ms in timings.items())
    print(f"{width}x{height} ms a decode at each scale: {listed}")
    for name, (ms, quality) in fast_modes(jpegs, args.scale, args.image_size, args.repeats).items():
        print(f"{width}x{height} full size, {name}: {ms:.3f} ms, worst crop PSNR {quality:.1f} dB")


ENTROPY_ONLY = "entropy only (last row)"


def box_shares(jpegs: list, scale: int, size: int, repeats: int) -> tuple[float, dict[str, float]]:
    """(milliseconds a whole-frame decode, each kind of box's decode as a share of it): medians
    of rounds, each round's boxes timed right after its whole frames."""
    sizes = [simplejpeg.decode_jpeg_header(jpeg)[1::-1] for jpeg in jpegs]
    boxes = {ENTROPY_ONLY: [(0, h - 1, w, h) for w, h in sizes]}
    plans = []
    for position, (width, height) in enumerate(sizes):
        rng = random.Random(f"0:{position}")
        plans.append(transforms.scale_plan(width, height, scale, size, rng, False))
    boxes["scale crop"] = [plan.crop.box for plan in plans]
    boxes["random-resized crops"] = [
        transforms.random_resized_plan(
            w, h, size, DEFAULT_CROP_AREA, DEFAULT_CROP_RATIO, random.Random(i), False
        ).crop.box
        for i, (w, h) in enumerate(sizes)
    ]
    shares: dict[str, list[float]] = {kind: [] for kind in boxes}
    whole_ms = []
    for _ in range(repeats):
        whole = best_ms(simplejpeg.decode_jpeg, jpegs, 1)
        whole_ms.append(whole)
        for kind, kind_boxes in boxes.items():
            started = time.perf_counter()
            for jpeg, frame, box in zip(jpegs, sizes, kind_boxes):
                decode_jpeg_box(jpeg, frame, 3, 1, box)
            shares[kind].append((time.perf_counter() - started) / len(jpegs) * 1e3 / whole)
    return statistics.median(whole_ms), {kind: statistics.median(v) for kind, v in shares.items()}


def region_report(name: str, jpegs: list, args) -> None:
    whole, shares = box_shares(jpegs, args.scale, args.image_size, args.repeats)
    listed = "; ".join(f"{kind} {share:.2f}" for kind, share in shares.items())
    print(f"{name}: whole frame {whole:.2f} ms; box / whole frame: {listed}")


def scenes(width: int, height: int, images: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    return [bench_data.jpeg_bytes(bench_data.make_photo(rng, width, height)) for _ in range(images)]


def jpeg_figures(photos: str, images: int, repeats: int) -> dict[str, float]:
    """The declared figures: 500x375 scenes, and the photographs' files (in a tree's process)."""
    torch.set_num_threads(1)
    made = scenes(500, 375, images)
    ms = scale_ms(made, 375, repeats)
    modes = fast_modes(made, SCALE, SIZE, repeats)
    _, scene_boxes = box_shares(made, SCALE, SIZE, repeats)
    _, photo_boxes = box_shares(bench_data.read_jpegs(photos, images), SCALE, SIZE, repeats)
    return {
        "dct_6_8_vs_full": ms[6] / ms[8],
        "dct_1_8_vs_full": ms[1] / ms[8],
        "fast_decode_vs_accurate": modes["both fast"][0] / modes["accurate"][0],
        "fast_decode_worst_psnr": modes["both fast"][1],
        "scenes_entropy_vs_full_decode": scene_boxes[ENTROPY_ONLY],
        "scenes_rr_box_vs_full_decode": scene_boxes["random-resized crops"],
        "scenes_scale_box_vs_full_decode": scene_boxes["scale crop"],
        "photos_entropy_vs_full_decode": photo_boxes[ENTROPY_ONLY],
    }


def _share(name: str, doc: str) -> Figure:
    return Figure(name, "x", LOWER, None, 0.15, doc)


@benchmark(
    "jpeg_scaling",
    "JPEG decoding: DCT scales, fast modes, boxes",
    (
        _share("dct_6_8_vs_full", "a 6/8-scale decode of 500x375 scenes over a full-size one"),
        _share("dct_1_8_vs_full", "a 1/8-scale decode over a full-size one"),
        _share(
            "fast_decode_vs_accurate",
            "libjpeg-turbo's fast DCT and fast upsampling together over its accurate modes, "
            "full size",
        ),
        Figure(
            "fast_decode_worst_psnr",
            "dB",
            HIGHER,
            None,
            0.05,
            "the fast modes' worst 224 px centre crop against the accurate decode's crop, PSNR",
        ),
        _share(
            "scenes_entropy_vs_full_decode",
            "the last row's box over the whole frame, scenes: the entropy decoding's share",
        ),
        _share(
            "scenes_rr_box_vs_full_decode",
            "random-resized boxes (224 px out) decoded alone over whole frames, scenes",
        ),
        _share("scenes_scale_box_vs_full_decode", "the scale crop's boxes, the same"),
        _share(
            "photos_entropy_vs_full_decode",
            "the entropy decoding's share of a decode, the photographs' files",
        ),
    ),
    prepare=prepare_photo_sets,
    order=27,
)
def measure_jpeg_scaling(context: Context, tree: Tree) -> dict[str, float]:
    photos = photo_sets(context)["files"]
    return tree.call(
        "benchmarks.jpeg_scaling:jpeg_figures", threads=1, photos=photos, images=20, repeats=5
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="500x375,1000x750")
    parser.add_argument("--images", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7, help="best of, per figure")
    parser.add_argument("--scale", type=int, default=SCALE)
    parser.add_argument("--image_size", type=int, default=SIZE)
    parser.add_argument("--regions", action="store_true", help="only the box decodes' costs")
    parser.add_argument("--photo", default="", help="comma-separated JPEG files, with --regions")
    args = parser.parse_args()
    print(f"simplejpeg {simplejpeg.__version__}; load {os.getloadavg()[0]:.1f}")
    for size in args.sizes.split(","):
        width, height = (int(part) for part in size.split("x"))
        jpegs = scenes(width, height, args.images)
        if args.regions:
            region_report(f"{width}x{height}", jpegs, args)
        else:
            report(width, height, jpegs, args)
    for path in filter(None, args.photo.split(",")):
        with open(path, "rb") as file:
            region_report(os.path.basename(path), [file.read()], args)


if __name__ == "__main__":
    main()
