"""A training DB read from storage rather than from memory: `resnet50-db bench`'s pipeline over an
LMDB whose pages were dropped from the page cache, its reads throttled to a network disk's rate
(500 reads/s and 50 MB/s, a cgroup v1 blkio group on the DB's disk); the same with the DB cached;
and `cat data.mdb` through the same throttle, the rate the storage streams at. Needs root and
cgroup v1's blkio controller: elsewhere the benchmark says so and is skipped. The DB: 2,000 JPEGs
cut from photographs (bench_data.py), records in key order.
Run: python -m benchmarks run --only cold_reads"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks import bench_data
from benchmarks.input_pipeline import fetched_photos
from benchmarks.registry import HIGHER, Context, Figure, benchmark
from benchmarks.startup import evict, put_in_place
from benchmarks.trees import BENCHMARKS_ROOT, Tree

BLKIO = Path("/sys/fs/cgroup/blkio")
READS_PER_S, BYTES_PER_S = 500, 50 * 10**6
RECORDS = 2000
BATCH, BATCHES = 64, 12  # 832 records a measurement: under half the DB, no pass repeats


def cold_db(context: Context) -> Path:
    return context.data / "cold" / f"lmdb_photos_{RECORDS}"


def make_cold_db(context: Context) -> None:
    target = cold_db(context)
    if target.is_dir():
        return
    photos = fetched_photos(context)
    target.parent.mkdir(parents=True, exist_ok=True)
    building = tempfile.mkdtemp(dir=target.parent, prefix=".cold.")
    try:
        this = Tree("this", BENCHMARKS_ROOT)
        lmdb = this.call("benchmarks.cold_reads:build", out=building, photos=str(photos))
        put_in_place(Path(lmdb), target)
    finally:
        shutil.rmtree(building, ignore_errors=True)


def build(out: str, photos: str) -> str:
    """Runs in this checkout's process: the set's LMDB (records in key order), its path."""
    return bench_data.build(out, RECORDS, photos=photos)[1]


def disk_of(path: Path) -> str:
    """ "MAJOR:MINOR" of the whole disk holding `path` (blkio throttles disks, not partitions)."""
    device = os.stat(path).st_dev
    block = Path(f"/sys/dev/block/{os.major(device)}:{os.minor(device)}")
    if (block / "partition").exists():
        block = block.resolve().parent
    return (block / "dev").read_text().strip()


def throttled_group(disk: str) -> Path:
    """A blkio group of this run, throttled to READS_PER_S and BYTES_PER_S on `disk`."""
    group = BLKIO / f"resnet50_bench_{os.getpid()}"
    group.mkdir(exist_ok=True)
    (group / "blkio.throttle.read_iops_device").write_text(f"{disk} {READS_PER_S}\n")
    (group / "blkio.throttle.read_bps_device").write_text(f"{disk} {BYTES_PER_S}\n")
    return group


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "needs root, to make a cgroup v1 blkio group"
    if not (BLKIO / "blkio.throttle.read_iops_device").exists():
        return f"no cgroup v1 blkio controller at {BLKIO}"
    return None


def bench_rate(db: str, workers: int, group: str, cold: bool) -> float:
    """Runs in a tree's process: joins `group` (its input processes too), drops the DB from the
    page cache if `cold`, and times `resnet50-db bench`'s pipeline."""
    import argparse

    from resnet50_trainer.tools.db import bench

    if group:
        Path(group, "tasks").write_text(f"{os.getpid()}\n")
    if cold:
        evict(Path(db))
    arguments = dict(db=db, db_type="lmdb", batch_size=BATCH, image_size=224, scale=None)
    arguments |= dict(crop="random_resized", num_channels=3, num_workers=workers)
    arguments |= dict(batches=BATCHES, device="cpu", decode_device="cpu", seed=0)
    return bench.bench(argparse.Namespace(**arguments))


def streamed_records_s(db: Path, group: Path) -> float:
    """Records a second that `cat data.mdb` reads cold through the throttle."""
    data = db / "data.mdb"
    evict(db)
    started = time.perf_counter()
    subprocess.run(
        ["sh", "-c", f"echo $$ > {group}/tasks && exec cat {data} > /dev/null"], check=True
    )
    return RECORDS / (time.perf_counter() - started)


def _figure(name: str, goal: float | None, doc: str) -> Figure:
    return Figure(name, "x" if goal else "images/s", HIGHER, goal, 0.2, doc)


@benchmark(
    "cold_reads",
    "A DB read from storage (500 reads/s, 50 MB/s)",
    (
        _figure(
            "cold_random_vs_reads",
            0.8,
            "random order, 0 input processes, the DB dropped from the page cache and read "
            "through the throttle: images/s over the throttle's 500 reads/s (a read a record "
            "is 1.0)",
        ),
        _figure("cold_random_images_s", None, "random order, cold, throttled, 0 processes"),
        _figure("cold_random_w2_images_s", None, "the same, 2 input processes"),
        _figure("cached_random_images_s", None, "random order, the DB in the page cache"),
        _figure("streamed_records_s", None, "`cat data.mdb` through the throttle, records/s"),
    ),
    prepare=make_cold_db,
    unavailable=_unavailable,
    rounds=(2, 3),
)
def measure_cold_reads(context: Context, tree: Tree) -> dict[str, float]:
    db = cold_db(context)
    group = throttled_group(disk_of(db))
    try:

        def rate(workers: int = 0, cold: bool = True) -> float:
            throttle = str(group) if cold else ""
            return float(
                tree.call(
                    "benchmarks.cold_reads:bench_rate",
                    db=str(db),
                    workers=workers,
                    group=throttle,
                    cold=cold,
                )
            )

        cold_random = rate()
        figures = {
            "cold_random_vs_reads": cold_random / READS_PER_S,
            "cold_random_images_s": cold_random,
            "cold_random_w2_images_s": rate(workers=2),
            "streamed_records_s": streamed_records_s(db, group),
        }
        (db / "data.mdb").read_bytes()  # cached: read once, unthrottled
        figures["cached_random_images_s"] = rate(cold=False)
        return figures
    finally:
        group.rmdir()
