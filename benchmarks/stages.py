"""Per-image cost of each stage of the CPU input pipeline, one core, before and after decoding only
the crop's box: DB read, record parse, JPEG header and crop plan, decode, resize of the crop, the
batch, and the hand-over to the training process (the batch's way into shared memory). "Before"
is the whole-frame path (full decode, a crop tensor resized and mirrored alone, torch.stack, the
batch copied into shared memory when an input process hands it over); "after" is the trainer's
path (data/cpu_decode.py: the box decoded alone, resized into its slot of a batch tensor allocated
in shared memory, mirrored as it is written). Its figures (random-resized crops of the
photographs): python -m benchmarks run --only stages. Every stage of both crops, alone:
python -m benchmarks.stages [--images 512]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import simplejpeg
import torch

from benchmarks import bench_data
from benchmarks.input_pipeline import IMAGES, photo_sets, prepare_photo_sets
from benchmarks.registry import LOWER, Context, Figure, benchmark
from benchmarks.trees import Tree
from resnet50_trainer.data import transforms
from resnet50_trainer.data.formats.databases import open_database
from resnet50_trainer.data.formats.images import decode_jpeg_reduced, jpeg_header
from resnet50_trainer.data.formats.jpeg_region import REGION_DECODE, decode_jpeg_box
from resnet50_trainer.data.formats.record_view import parse_record_view
from resnet50_trainer.data.formats.records import Record, parse_record
from resnet50_trainer.data.settings import DEFAULT_CROP_AREA, DEFAULT_CROP_RATIO

BATCH = 64
SIZE, SCALE = 224, 256


def per_image_us(work: Callable[[], object], count: int, repeats: int = 3) -> float:
    """Best of `repeats` runs of `work` (which handles `count` images), in microseconds an image."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - started)
    return best / count * 1e6


def plans_for(headers: list, crop: str) -> list:
    plans = []
    for position, (width, height, _) in enumerate(headers):
        rng = random.Random(f"0:{position}")
        if crop == "random_resized":
            plans.append(
                transforms.random_resized_plan(
                    width, height, SIZE, DEFAULT_CROP_AREA, DEFAULT_CROP_RATIO, rng, True
                )
            )
        else:
            plans.append(transforms.scale_plan(width, height, SCALE, SIZE, rng, True))
    return plans


def decoded_boxes(records: list, headers: list, plans: list) -> list:
    """(pixels, crop) of each plan's box decoded as the trainer decodes it (cpu_decode.py): the
    crop is the whole box, mirrored as planned."""
    boxes = []
    for record, frame, plan in zip(records, headers, plans):
        pixels = decode_jpeg_box(record.encoded, frame.size, 3, plan.reduction, plan.crop.box)
        height, width = pixels.shape[:2]
        boxes.append((pixels, transforms.CropPlan((0, 0, width, height), plan.crop.mirror)))
    return boxes


def crop_stages(crop: str, records: list, headers: list) -> tuple[dict, dict, float]:
    """(before, after): per-image costs of the stages from the decode on; and the plan's."""
    count = len(records)
    plans = plans_for(headers, crop)
    plan = per_image_us(
        lambda: plans_for([jpeg_header(record.encoded) for record in records], crop), count
    )
    full = [
        decode_jpeg_reduced(r.encoded, frame.size, p.reduction)
        for r, frame, p in zip(records, headers, plans)
    ]
    boxes = decoded_boxes(records, headers, plans)
    before = {
        "decode": per_image_us(
            lambda: [
                decode_jpeg_reduced(r.encoded, frame.size, p.reduction)
                for r, frame, p in zip(records, headers, plans)
            ],
            count,
        ),
        "resize": per_image_us(
            lambda: [
                transforms.resize_crop(torch.from_numpy(f).permute(2, 0, 1), p.crop, SIZE)
                for f, p in zip(full, plans)
            ],
            count,
        ),
    }
    crops = [
        transforms.resize_crop(torch.from_numpy(f).permute(2, 0, 1), p.crop, SIZE)
        for f, p in zip(full, plans)
    ]
    before["batch"] = per_image_us(
        lambda: [torch.stack(crops[i : i + BATCH]) for i in range(0, count, BATCH)], count
    )
    stacked = torch.stack(crops[:BATCH])
    before["hand-over"] = per_image_us(lambda: stacked.clone().share_memory_(), BATCH)
    slots = np.empty((count, SIZE, SIZE, 3), np.uint8)

    def resize_into_slots() -> None:
        for i, (pixels, box_plan) in enumerate(boxes):
            transforms.resize_into(pixels, box_plan, slots[i])

    after = {
        "decode": per_image_us(
            lambda: [
                decode_jpeg_box(r.encoded, frame.size, 3, p.reduction, p.crop.box)
                for r, frame, p in zip(records, headers, plans)
            ],
            count,
        ),
        "resize": per_image_us(resize_into_slots, count),
    }
    after["batch"] = 0.0  # the resize writes each crop, mirrored or not, into its slot
    nbytes = BATCH * 3 * SIZE * SIZE
    after["hand-over"] = per_image_us(lambda: torch.UntypedStorage._new_shared(nbytes), BATCH)
    return before, after, plan


def jpeg_of(record: Record) -> bytes | memoryview:
    """The record's JPEG: bench_data's sets hold files, never raw pixels."""
    if record.encoded is None:
        raise ValueError("a record of raw pixels in a benchmark set of JPEGs")
    return record.encoded


def marked_decode(marked_lmdb: str, keys: list, headers: list, crop: str) -> tuple[float, float]:
    """(box decode, bare full-frame decode) per image, microseconds, of the same images with
    restart markers (benchmarks/input_pipeline.py --restart_markers), for the same crop plans."""
    with open_database(marked_lmdb, "lmdb") as marked:
        jpegs = [jpeg_of(parse_record(marked.get(key))) for key in keys]
    plans = plans_for(headers, crop)
    box = per_image_us(
        lambda: [
            decode_jpeg_box(jpeg, frame.size, 3, p.reduction, p.crop.box)
            for jpeg, frame, p in zip(jpegs, headers, plans)
        ],
        len(jpegs),
    )
    bare = per_image_us(lambda: [simplejpeg.decode_jpeg(jpeg) for jpeg in jpegs], len(jpegs))
    return box, bare


def stage_costs(lmdb: str, images: int, marked_lmdb: str | None = None) -> dict[str, dict]:
    """Per crop: microseconds an image of bare full-frame decoding (`bare`), the header and plan
    (`plan`), each stage before and after (`stages`), and with restart markers the box's decode and
    those files' bare decode (`marked`, where `marked_lmdb` is given); one thread."""
    torch.set_num_threads(1)
    costs = {}
    with open_database(lmdb, "lmdb") as database:
        keys = database.keys()[: images - images % BATCH]
        values = [database.get(key) for key in keys]
        records = [parse_record(value) for value in values]
        headers = [jpeg_header(record.encoded) for record in records]
        count = len(keys)
        views = [database.view(key) for key in keys]
        # Before: a copy out of the database, the protobuf parse copying the file out of the
        # record. After: a view of the LMDB's memory map, the encoded Datum's fields walked by hand.
        read = {
            "before": per_image_us(lambda: [database.get(key) for key in keys], count),
            "after": per_image_us(lambda: [database.view(key) for key in keys], count),
        }
        parse = {
            "before": per_image_us(lambda: [parse_record(value) for value in values], count),
            "after": per_image_us(lambda: [parse_record_view(view) for view in views], count),
        }
        for crop in ("scale", "random_resized"):
            # Measured again beside each crop's stages: the machine's load moves.
            bare = per_image_us(lambda: [simplejpeg.decode_jpeg(r.encoded) for r in records], count)
            before, after, plan = crop_stages(crop, records, headers)
            stages = {"DB read": read, "parse": parse}
            stages.update({name: {"before": before[name], "after": after[name]} for name in before})
            costs[crop] = {"count": count, "bare": bare, "plan": plan, "stages": stages}
            if marked_lmdb is not None:
                costs[crop]["marked"] = marked_decode(marked_lmdb, keys, headers, crop)
    return costs


def report(lmdb: str, images: int, marked_lmdb: str | None = None) -> None:
    costs = stage_costs(lmdb, images, marked_lmdb)
    count = next(iter(costs.values()))["count"]
    print(
        f"\nper-image cost of each stage, microseconds, one core, {count} images "
        f"(region decode {'built' if REGION_DECODE else 'NOT built: whole frames'}):"
    )
    for crop, cost in costs.items():
        bare, plan, stages = cost["bare"], cost["plan"], cost["stages"]
        print(f"  --crop {crop} (bare full-frame decode, simplejpeg: {bare:.0f}):")
        print(f"    header + plan: {plan:.0f}")
        for stage, sides in stages.items():
            print(f"    {stage}: before {sides['before']:.0f}, after {sides['after']:.0f}")
        for side in ("before", "after"):
            total = plan + sum(sides[side] for sides in stages.values())
            print(f"    sum {side}: {total:.0f} ({bare / total:.2f}x bare decode's rate)")
        if "marked" in cost:
            box, marked_bare = cost["marked"]
            total = after_total(cost) - stages["decode"]["after"] + box
            print(
                f"    with restart markers: decode {box:.0f} (bare full-frame decode of those "
                f"files {marked_bare:.0f}); sum {total:.0f} ({bare / total:.2f}x bare decode's "
                f"rate, {marked_bare / total:.2f}x theirs)"
            )


def after_total(cost: dict) -> float:
    """Microseconds an image of the trainer's path: the plan and every stage, after."""
    return cost["plan"] + sum(sides["after"] for sides in cost["stages"].values())


def stage_figures(lmdb: str, marked_lmdb: str, images: int) -> dict[str, float]:
    """The declared figures, of random-resized crops (in a tree's one-thread process)."""
    cost = stage_costs(lmdb, images, marked_lmdb)["random_resized"]
    stages, bare = cost["stages"], cost["bare"]
    (marked_box, marked_bare), box = cost["marked"], stages["decode"]["after"]
    return {
        "stages_rr_box_us": box,
        "stages_rr_marked_box_us": marked_box,
        "stages_rr_box_vs_full_decode": box / bare,
        "stages_rr_marked_box_vs_full_decode": marked_box / bare,
        "stages_rr_resize_vs_full_decode": stages["resize"]["after"] / bare,
        "stages_marked_full_decode_vs_full_decode": marked_bare / bare,
        "stages_around_decode_us": after_total(cost) - box - stages["resize"]["after"],
    }


def _figure(name: str, unit: str, doc: str) -> Figure:
    return Figure(name, unit, LOWER, None, 0.2, doc)


@benchmark(
    "stages",
    "The input pipeline's stages, one core",
    (
        _figure(
            "stages_rr_box_us",
            "us",
            "a random-resized crop's box decoded alone (data/formats/jpeg_region.py) from the "
            "photographs' LMDB without restart markers: the rows above it entropy-decoded",
        ),
        _figure("stages_rr_marked_box_us", "us", "the same with restart markers: the box alone"),
        _figure(
            "stages_rr_box_vs_full_decode",
            "x",
            "the box without markers over bare full-frame decoding (simplejpeg) of the same files",
        ),
        _figure("stages_rr_marked_box_vs_full_decode", "x", "the box with markers, the same"),
        _figure(
            "stages_rr_resize_vs_full_decode",
            "x",
            "the box's resize into its batch slot over bare full-frame decoding",
        ),
        _figure(
            "stages_marked_full_decode_vs_full_decode",
            "x",
            "bare full-frame decoding of the files with restart markers over that of plain ones",
        ),
        _figure(
            "marked_bytes_vs_plain",
            "x",
            "the photographs' files with a restart marker after every MCU over the plain ones, "
            "bytes (not timed: the same every round)",
        ),
        _figure(
            "stages_around_decode_us",
            "us",
            "all but the decode and the resize, an image: the DB read (a view of the map), "
            "the record's parse, header and crop plan, the batch and its hand-over",
        ),
    ),
    prepare=prepare_photo_sets,
    order=26,
)
def measure_stages(context: Context, tree: Tree) -> dict[str, float]:
    sets = photo_sets(context)
    figures = tree.call(
        "benchmarks.stages:stage_figures",
        threads=1,
        lmdb=sets["lmdb"],
        marked_lmdb=sets["marked_lmdb"],
        images=IMAGES,
    )
    marked, plain = (folder_bytes(sets[name]) for name in ("marked_files", "files"))
    return {**figures, "marked_bytes_vs_plain": marked / plain}


def folder_bytes(root: str) -> int:
    return sum(path.stat().st_size for path in Path(root).rglob("*") if path.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "resnet50_bench_data"))
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--photos", default="", help="cut the JPEGs from these photographs")
    args = parser.parse_args()
    _, lmdb = bench_data.build(args.out, args.images, photos=args.photos)
    report(lmdb, args.images)


if __name__ == "__main__":
    main()
