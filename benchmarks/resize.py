"""Per-image cost of the crop's resize into its batch slot, one core: PyTorch's uint8 antialiased
operator and a flip for mirrored crops (the trainer's path before data/_resample.c, and its
fallback) against our resampler, on the boxes the trainer decodes from the benchmark's
photographs (benchmarks/bench_data.py), both crops; the same pixels are checked. Its figures:
python -m benchmarks run --only resize. Alone, with the boxes' sizes:
OMP_NUM_THREADS=1 python -m benchmarks.resize --photos DIR [--images 640]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

from benchmarks import bench_data
from benchmarks.input_pipeline import IMAGES, photo_sets, prepare_photo_sets
from benchmarks.registry import HIGHER, Context, Figure, benchmark
from benchmarks.stages import SIZE, decoded_boxes, plans_for
from benchmarks.trees import Tree
from resnet50_trainer.data import transforms
from resnet50_trainer.data.formats.databases import open_database
from resnet50_trainer.data.formats.images import jpeg_header
from resnet50_trainer.data.formats.records import parse_record

CROPS = {"scale": "scale", "random_resized": "rr"}  # --crop: its short name in the figures
ROUNDS = 7


def boxes_of(lmdb: str, images: int, crop: str) -> list:
    """The decoded boxes of the trainer's plans for `crop`, each with its crop in its pixels."""
    with open_database(lmdb, "lmdb") as database:
        records = [parse_record(database.get(key)) for key in database.keys()[:images]]
    headers = [jpeg_header(record.encoded) for record in records]
    return decoded_boxes(records, headers, plans_for(headers, crop))


def per_image_us(boxes: list, slots: np.ndarray, resampler: bool) -> float:
    transforms.RESAMPLER = resampler
    started = time.perf_counter()
    for slot, (pixels, plan) in enumerate(boxes):
        transforms.resize_into(pixels, plan, slots[slot])
    return (time.perf_counter() - started) / len(boxes) * 1e6


def resize_costs(boxes: list, rounds: int) -> tuple[float, float]:
    """(PyTorch's operator and a flip, ours): microseconds an image, the median of `rounds`
    interleaved rounds (the machine's load moves); the two must make the same pixels."""
    if not transforms.RESAMPLER:
        raise RuntimeError("the resampler does not run here (not built, or no AVX2)")
    ours, theirs = (np.empty((len(boxes), SIZE, SIZE, 3), np.uint8) for _ in range(2))
    costs: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds):
        for resampler, slots in ((False, theirs), (True, ours)):
            costs[resampler].append(per_image_us(boxes, slots, resampler))
    assert np.array_equal(ours, theirs), "the resampler's crops differ from PyTorch's"
    return statistics.median(costs[False]), statistics.median(costs[True])


def speedups(lmdb: str, images: int, rounds: int) -> dict[str, float]:
    """The figures, in a tree's one-thread process."""
    torch.set_num_threads(1)
    figures = {}
    for crop, short in CROPS.items():
        before, after = resize_costs(boxes_of(lmdb, images, crop), rounds)
        figures[f"resize_{short}_vs_pytorch"] = before / after
    return figures


def _no_avx2() -> str | None:
    with open("/proc/cpuinfo") as cpuinfo:
        return None if " avx2" in cpuinfo.read() else "the resampler needs AVX2"


@benchmark(
    "resize",
    "The crop's resize, one core",
    tuple(
        Figure(
            f"resize_{short}_vs_pytorch",
            "x",
            HIGHER,
            None,
            0.15,
            f"`--crop {crop}` boxes of the photographs resized into 224 px slots: PyTorch's uint8 "
            "antialiased operator and a flip (microseconds an image) over our resampler's "
            "(data/_resample.c), the same pixels",
        )
        for crop, short in CROPS.items()
    ),
    prepare=prepare_photo_sets,
    unavailable=_no_avx2,
    order=25,
)
def measure_resize(context: Context, tree: Tree) -> dict[str, float]:
    lmdb = photo_sets(context)["lmdb"]
    return tree.call("benchmarks.resize:speedups", threads=1, lmdb=lmdb, images=IMAGES, rounds=3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "resnet50_bench_data"))
    parser.add_argument("--images", type=int, default=640)
    parser.add_argument("--photos", default="", help="cut the JPEGs from these photographs")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args()
    if not transforms.RESAMPLER:
        sys.exit("the resampler does not run here (not built, or no AVX2): nothing to compare")
    torch.set_num_threads(1)
    _, lmdb = bench_data.build(args.out, args.images, photos=args.photos)
    print(f"{args.images} boxes a crop, {SIZE}x{SIZE} crops, one core; microseconds an image")
    for crop in CROPS:
        boxes = boxes_of(lmdb, args.images, crop)
        before, after = resize_costs(boxes, args.rounds)
        sides = [pixels.shape[1] for pixels, _ in boxes]
        print(
            f"  --crop {crop} (box width {min(sides)}-{max(sides)}, median "
            f"{statistics.median(sides):.0f}): PyTorch's operator + flip {before:.0f}, "
            f"ours {after:.0f} ({before / after:.2f}x; median of {args.rounds} rounds; same pixels)"
        )


if __name__ == "__main__":
    main()
