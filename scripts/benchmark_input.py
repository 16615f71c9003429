"""Input pipeline: ours (`resnet50-db bench`'s pipeline) against bare libjpeg-turbo decoding and
torchvision's ImageFolder pipeline as PyTorch's ImageNet example builds it, same JPEGs, in one run.

Bare decode: simplejpeg's full-frame decode of every file's bytes, nothing else, one core.
Baseline: ImageFolder (Pillow open + convert RGB), RandomResizedCrop(224), RandomHorizontalFlip,
ToTensor, Normalize, DataLoader(shuffle=True). Ours: the Datum records holding the same JPEG bytes,
uint8 crops, normalisation left to the device; one row per training crop (--crops), per worker
count, and (0 workers) per database type and for `--decode_device gpu`'s CPU side (the input
processes' part: bytes and crop plans). Each figure is taken in a fresh process with one torch
thread (one core per decoding process, as in DataLoader workers): one warm-up batch, then
--batches batches. The machine is shared, so the configurations are measured in interleaved
rounds (every one once a round, --rounds rounds) and each ratio is taken within a round;
`--trees name=DIR,...` measures ours in other checkouts too (e.g. the previous commit, exported),
in the same rounds. `--stages` first prints the per-image cost of each stage (benchmark_stages.py).
`--restart_markers` also times ours on a copy of the set whose JPEGs have a restart marker after
every MCU (`resnet50-db create --restart_markers`), against bare decoding of both sets' files.
Usage: python scripts/benchmark_input.py [--workers 0,2] [--crops scale,random_resized]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_data  # noqa: E402

MARKED = "markers"  # the set whose JPEGs have restart markers (--restart_markers)
IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def bare_rate(root: str, images: int) -> float:
    """Full-frame decodes per second of the files' bytes, read into memory first."""
    import simplejpeg

    jpegs = []
    for folder, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(folder, name), "rb") as file:
                jpegs.append(file.read())
    jpegs = jpegs[:images]
    simplejpeg.decode_jpeg(jpegs[0])
    started = time.perf_counter()
    for jpeg in jpegs:
        simplejpeg.decode_jpeg(jpeg)
    return len(jpegs) / (time.perf_counter() - started)


def baseline_rate(root: str, batch_size: int, batches: int, workers: int, image_size: int) -> float:
    import torch
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

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
    db: str, db_type: str, batch_size: int, batches: int, workers: int, crop: str
) -> float:
    """`resnet50-db bench`'s figure for the trainer's pipeline (CPU decode)."""
    from resnet50_trainer.tools.db import bench

    args = argparse.Namespace(
        db=db,
        db_type=db_type,
        batch_size=batch_size,
        image_size=224,
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


def gpu_side_rate(db: str, db_type: str, batch_size: int, batches: int, crop: str) -> float:
    """`--decode_device gpu`'s input side alone: records read, headers parsed, crops planned and
    the bytes batched (what reaches the GPU's decoder), in this process."""
    from resnet50_trainer.data.dataset import ImageRecords
    from resnet50_trainer.data.formats.databases import read_keys
    from resnet50_trainer.data.gpu_decode import GpuDecode
    from resnet50_trainer.data.input_pipeline import make_loader
    from resnet50_trainer.data.order import RecordOrder, ShardBatchSampler
    from resnet50_trainer.data.settings import InputSettings

    keys = read_keys(db, db_type)
    sampler = ShardBatchSampler(RecordOrder(len(keys), 0), batches + 1, batch_size, batch_size, 0)
    settings = InputSettings(2**31 - 1, 3, 256, 224, 0, 0, True, crop=crop)
    records = ImageRecords(db, db_type, keys, settings, True, GpuDecode(settings))
    batches_of = iter(make_loader(records, sampler, 0, pin_memory=False))
    next(batches_of)
    started = time.perf_counter()
    images = sum(len(batch.labels) for batch in batches_of)
    return images / (time.perf_counter() - started)


def child(spec: dict) -> float:
    """One figure, measured in this (fresh) process."""
    import torch

    torch.set_num_threads(1)
    kind = spec["kind"]
    if kind == "bare":
        return bare_rate(spec["root"], spec["images"])
    if kind == "baseline":
        return baseline_rate(
            spec["root"], spec["batch_size"], spec["batches"], spec["workers"], 224
        )
    if kind == "gpu_side":
        return gpu_side_rate(
            spec["db"], spec["db_type"], spec["batch_size"], spec["batches"], spec["crop"]
        )
    return ours_rate(
        spec["db"],
        spec["db_type"],
        spec["batch_size"],
        spec["batches"],
        spec["workers"],
        spec["crop"],
    )


def measure(spec: dict, tree: str) -> float:
    """The figure of `spec`, taken by this script in a child process importing `tree`'s code."""
    environment = dict(os.environ, PYTHONPATH=os.path.abspath(tree), OMP_NUM_THREADS="1")
    output = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)],
        env=environment,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(output.split()[-1])


def configurations(
    args, root: str, lmdb: str, marked: tuple[str, str] | None
) -> list[tuple[str, str, dict]]:
    """(name, tree, spec) of every figure a round takes; `marked`: the set with restart markers."""
    common = {"batch_size": args.batch_size, "batches": args.batches, "images": args.images}
    trees = dict(part.split("=", 1) for part in args.trees.split(","))
    crops = args.crops.split(",")
    workers_list = [int(part) for part in args.workers.split(",")]
    configs = [("bare decode", ".", dict(common, kind="bare", root=root))]
    databases = [("lmdb", lmdb)]
    if marked is not None:
        configs.append((f"bare decode {MARKED}", ".", dict(common, kind="bare", root=marked[0])))
        databases.append((f"lmdb {MARKED}", marked[1]))
    for workers in workers_list:
        spec = dict(common, kind="baseline", root=root, workers=workers)
        configs.append((f"baseline w{workers}", ".", spec))
    for name, tree in trees.items():
        for workers in workers_list:
            for crop in crops:
                for db_name, db in databases:
                    spec = dict(
                        common, kind="ours", db=db, db_type="lmdb", workers=workers, crop=crop
                    )
                    configs.append((f"{name} {db_name} {crop} w{workers}", tree, spec))
        if args.extra_modes:
            leveldb = bench_data.leveldb_copy(lmdb)
            for crop in crops:
                spec = dict(
                    common, kind="ours", db=leveldb, db_type="leveldb", workers=0, crop=crop
                )
                configs.append((f"{name} leveldb {crop} w0", tree, spec))
                spec = dict(common, kind="gpu_side", db=lmdb, db_type="lmdb", crop=crop)
                configs.append((f"{name} gpu-side lmdb {crop} w0", tree, spec))
    return configs


def report(figures: dict[str, list[float]], args) -> None:
    print("\nmedian images/s over the rounds (each round's figure):")
    for name, rates in figures.items():
        listed = ", ".join(f"{rate:.0f}" for rate in rates)
        print(f"  {name}: {statistics.median(rates):.1f} ({listed})")
    print("\nratios, within each round (median; each round's):")
    names = list(figures)
    for name in names:
        if " lmdb " not in name:
            continue
        workers = name.rsplit(" w", 1)[1]
        against = ["bare decode"] if workers == "0" else []
        if workers == "0" and MARKED in name:
            against.append(f"bare decode {MARKED}")
        against.append(f"baseline w{workers}")
        for reference in against:
            ratios = [ours / base for ours, base in zip(figures[name], figures[reference])]
            listed = ", ".join(f"{ratio:.2f}" for ratio in ratios)
            print(f"  {name} / {reference}: {statistics.median(ratios):.2f}x ({listed})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "resnet50_bench_data"))
    parser.add_argument("--images", type=int, default=512)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument(
        "--batches", type=int, default=7, help="timed batches (images >= (batches+1) x batch)"
    )
    parser.add_argument("--workers", default="0,2", help="comma-separated input process counts")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--crops", default="scale,random_resized", help="training crops of ours")
    parser.add_argument("--trees", default="ours=.", help="name=checkout,... whose code to time")
    parser.add_argument(
        "--extra_modes",
        action="store_true",
        help="also LevelDB and --decode_device gpu's CPU side, 0 workers",
    )
    parser.add_argument("--stages", action="store_true", help="per-image stage costs first")
    parser.add_argument(
        "--photos", default="", help="cut the JPEGs from the photographs in this folder"
    )
    parser.add_argument(
        "--restart_markers",
        action="store_true",
        help="also ours on the set's copy with restart markers (resnet50-db create's)",
    )
    args = parser.parse_args()
    if args.child:
        print(f"rate {child(json.loads(args.child)):.3f}")
        return
    if args.images < (args.batches + 1) * args.batch_size:
        parser.error("--images must hold the warm-up batch and --batches batches")
    root, lmdb = bench_data.build(args.out, args.images, photos=args.photos)
    print(f"data: {bench_data.describe(root)}; {os.cpu_count()} cores; uptime: {_uptime()}")
    marked = bench_data.with_restart_markers(root, lmdb) if args.restart_markers else None
    if args.stages:
        import benchmark_stages

        benchmark_stages.report(root, lmdb, args.images, marked[1] if marked else None)
    configs = configurations(args, root, lmdb, marked)
    figures: dict[str, list[float]] = {name: [] for name, _, _ in configs}
    for round_number in range(args.rounds):
        print(f"round {round_number + 1} (load {os.getloadavg()[0]:.1f}):", flush=True)
        for name, tree, spec in configs:
            figures[name].append(measure(spec, tree))
            print(f"  {name}: {figures[name][-1]:.1f} images/s", flush=True)
    report(figures, args)
    print(f"uptime at the end: {_uptime()}")


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    main()
