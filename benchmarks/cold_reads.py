"""A training DB read from storage rather than from memory: `resnet50-db bench`'s pipeline over an
LMDB whose pages were dropped from the page cache, its reads throttled to a network disk's rate
(500 reads/s and 50 MB/s, a cgroup v1 blkio group on the DB's disk), in random and quasi-random
order (--read_order; quasi-random in 8 MB windows, the DB ten of them); the same with the DB cached;
and `cat data.mdb` through the same throttle,
the rate the storage streams at. Needs root and cgroup v1's blkio controller: elsewhere the
benchmark says so and is skipped. The DB: 2,000 JPEGs cut from photographs (bench_data.py),
records in key order. Also (label_mix, no root) how well quasi-random order mixes the classes of
an ImageNet-shaped DB sorted by class.
Also (many_readers) two processes of one run reading their shares of the same cold DB together.
Run: python -m benchmarks run --only cold_reads many_readers"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks import bench_data
from benchmarks.input_pipeline import fetched_photos
from benchmarks.registry import HIGHER, Context, Figure, benchmark
from benchmarks.startup import evict, put_in_place
from benchmarks.trees import BENCHMARKS_ROOT, Tree

BLKIO = Path("/sys/fs/cgroup/blkio")
READS_PER_S, BYTES_PER_S = 500, 50 * 10**6
RECORDS = 2000
# 1,984 records a measurement, all timed: a pass over the DB (as an epoch reads it; quasi-random
# order asks for whole runs, which a part of a pass would not all use), none twice.
BATCH, BATCHES = 64, 30  # bench's batches: a warm-up batch more is read (and timed here)
READERS = 2  # training processes reading one DB (many_readers)
# Quasi-random windows of 8 MB (16 runs of 14 records): the 76 MB DB is 10 of them, as a DB larger
# than memory is many; in one window (the default 512 MB) the warm-up batch would ask storage for
# most of the DB's runs before the timing starts.
WINDOW_MB = 8


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


def bench_rate(
    db: str,
    order: str,
    workers: int,
    group: str,
    cold: bool,
    rank: int = 0,
    world_size: int = 1,
    together: str = "",
) -> float:
    """Runs in a tree's process: joins `group` (its input processes too), drops the DB from the
    page cache if `cold`, and times `resnet50-db bench`'s pipeline over a pass (as process `rank`
    of a run of `world_size`: its share): every batch, from the end of the set-up (listing the
    keys, the label check: a run's start, not its epochs' reads). Processes timed together meet
    in the folder `together` there, so that each one's set-up is out of the others' timing."""
    import argparse

    from resnet50_trainer.tools.db import bench

    if group:
        Path(group, "tasks").write_text(f"{os.getpid()}\n")
    if cold:
        evict(Path(db))
    arguments = dict(db=db, db_type="lmdb", batch_size=BATCH, image_size=224, scale=None)
    arguments |= dict(crop="random_resized", num_channels=3, num_workers=workers)
    arguments |= dict(batches=(BATCHES + 1) // world_size - 1, device="cpu", decode_device="cpu")
    window_mb = WINDOW_MB if order == "quasi_random" else None  # refused with random order
    arguments |= dict(seed=0, read_order=order, read_window_mb=window_mb)
    args = argparse.Namespace(**arguments)
    if _times_first_batch():
        return bench.bench(args, rank, world_size, start=lambda: _meet(together, rank, world_size))
    # A tree from before: its first batch untimed, and no ranks before many readers were measured.
    return bench.bench(args) if world_size == 1 else bench.bench(args, rank, world_size)


def _times_first_batch() -> bool:
    """Whether this tree's bench times its first batch from a start it is given (since e5eaf45)."""
    import inspect

    from resnet50_trainer.tools.db import bench

    return "start" in inspect.signature(bench.bench).parameters


def _meet(folder: str, rank: int, world_size: int) -> None:
    """Returns once all `world_size` processes have come here (a file each in `folder`; none to
    wait for without one)."""
    if not folder:
        return
    Path(folder, f"ready.{rank}").touch()
    while len(list(Path(folder).glob("ready.*"))) < world_size:
        time.sleep(0.005)


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
        _figure(
            "cold_quasi_random_vs_bound",
            0.8,
            "quasi-random order, 2 input processes, the same cold throttled DB: images/s over the "
            "lower of the same pipeline on the cached DB and `cat data.mdb` through the throttle "
            "(records/s)",
        ),
        _figure(
            "cached_quasi_random_vs_random",
            0.9,
            "the DB in the page cache: quasi-random order's images/s over random order's",
        ),
        _figure("cold_random_images_s", None, "random order, cold, throttled, 0 processes"),
        _figure("cold_random_w2_images_s", None, "the same, 2 input processes"),
        _figure("cold_quasi_random_images_s", None, "quasi-random order, cold, throttled"),
        _figure("cold_quasi_random_w2_images_s", None, "the same, 2 input processes"),
        _figure("cached_random_images_s", None, "random order, the DB in the page cache"),
        _figure("cached_quasi_random_images_s", None, "quasi-random order, the DB cached"),
        _figure("cached_quasi_random_w2_images_s", None, "the same, 2 input processes"),
        _figure("streamed_records_s", None, "`cat data.mdb` through the throttle, records/s"),
    ),
    prepare=make_cold_db,
    unavailable=_unavailable,
    rounds=(2, 3),
    order=30,
)
def measure_cold_reads(context: Context, tree: Tree) -> dict[str, float]:
    db = cold_db(context)
    group = throttled_group(disk_of(db))
    try:

        def rate(order: str, workers: int = 0, cold: bool = True) -> float:
            return float(
                tree.call(
                    "benchmarks.cold_reads:bench_rate",
                    db=str(db),
                    order=order,
                    workers=workers,
                    group=str(group) if cold else "",
                    cold=cold,
                )
            )

        cold_random, cold_quasi = rate("random"), rate("quasi_random")
        figures = {
            "cold_random_vs_reads": cold_random / READS_PER_S,
            "cold_random_images_s": cold_random,
            "cold_quasi_random_images_s": cold_quasi,
            "cold_random_w2_images_s": rate("random", workers=2),
            "cold_quasi_random_w2_images_s": rate("quasi_random", workers=2),
            "streamed_records_s": streamed_records_s(db, group),
        }
        (db / "data.mdb").read_bytes()  # cached: read once, unthrottled
        # The two cached rates are close and this machine drifts within a round: each the better
        # of two, taken in the order random, quasi, quasi, random.
        cached: dict[str, list[float]] = {order: [] for order in ("random", "quasi_random")}
        for order in ("random", "quasi_random", "quasi_random", "random"):
            cached[order].append(rate(order, cold=False))
        cached_random, cached_quasi = max(cached["random"]), max(cached["quasi_random"])
        cached_quasi_w2 = rate("quasi_random", workers=2, cold=False)
        bound = min(cached_quasi_w2, figures["streamed_records_s"])
        figures |= {
            "cold_quasi_random_vs_bound": figures["cold_quasi_random_w2_images_s"] / bound,
            "cached_quasi_random_w2_images_s": cached_quasi_w2,
            "cached_quasi_random_vs_random": cached_quasi / cached_random,
            "cached_random_images_s": cached_random,
            "cached_quasi_random_images_s": cached_quasi,
        }
        return figures
    finally:
        group.rmdir()


def reader_window(
    db: str, order: str, workers: int, group: str, rank: int, together: str
) -> list[float]:
    """Runs in a tree's process: bench_rate as process `rank` of READERS meeting in `together`,
    when its timing began and ended (wall-clock seconds), and the images it timed."""
    rate = bench_rate(
        db,
        order,
        workers,
        group,
        cold=False,  # dropped before both start
        rank=rank,
        world_size=READERS,
        together=together,
    )
    ended = time.time()
    images = (BATCHES + 1) // READERS * BATCH  # its share of the pass
    if not _times_first_batch():
        images -= BATCH
    return [ended - images / rate, ended, images]


def readers_rate(tree: Tree, db: Path, order: str, workers: int, group: Path | None) -> float:
    """Images/s of two processes of one run reading their shares of one pass together (each with
    `workers` input processes), the DB dropped from the page cache before they start where `group`
    throttles it: all their images over the time from their common start to the last one's
    end."""
    if group is not None:
        evict(db)

    def reader(rank: int, together: str) -> list[float]:
        return tree.call(
            "benchmarks.cold_reads:reader_window",
            db=str(db),
            order=order,
            workers=workers,
            group=str(group or ""),
            rank=rank,
            together=together,
        )

    with tempfile.TemporaryDirectory() as together, ThreadPoolExecutor(READERS) as readers:
        windows = list(readers.map(reader, range(READERS), [together] * READERS))
    span = max(end for _, end, _ in windows) - min(start for start, _, _ in windows)
    return sum(images for _, _, images in windows) / span


@benchmark(
    "many_readers",
    "Two training processes reading one DB from storage (500 reads/s, 50 MB/s)",
    (
        _figure(
            "readers_quasi_random_vs_bound",
            0.8,
            "two processes of a run, each with 2 input processes, reading their shares of one "
            "pass of the cold throttled DB of cold_reads in quasi-random order: their images/s "
            "together over the lower of the same on the cached DB and `cat data.mdb` through "
            "the throttle (records/s)",
        ),
        _figure("readers_quasi_random_images_s", None, "the same, 0 input processes"),
        _figure("readers_quasi_random_w2_images_s", None, "the two, 2 input processes each"),
        _figure("readers_random_images_s", None, "random order, 0 input processes"),
        _figure("readers_random_w2_images_s", None, "random order, 2 input processes each"),
        _figure("readers_cached_quasi_random_w2_images_s", None, "the DB cached, 2 each"),
        _figure("readers_streamed_records_s", None, "`cat data.mdb` through the throttle"),
    ),
    prepare=make_cold_db,
    unavailable=_unavailable,
    rounds=(2, 3),
    order=30,
)
def measure_many_readers(context: Context, tree: Tree) -> dict[str, float]:
    db = cold_db(context)
    group = throttled_group(disk_of(db))
    try:
        figures = {
            f"readers_{order}{suffix}_images_s": readers_rate(tree, db, order, workers, group)
            for order in ("quasi_random", "random")
            for workers, suffix in ((0, ""), (2, "_w2"))
        }
        figures["readers_streamed_records_s"] = streamed_records_s(db, group)
        (db / "data.mdb").read_bytes()  # cached: read once, unthrottled
        cached = readers_rate(tree, db, "quasi_random", 2, None)
        bound = min(cached, figures["readers_streamed_records_s"])
        figures |= {
            "readers_cached_quasi_random_w2_images_s": cached,
            "readers_quasi_random_vs_bound": figures["readers_quasi_random_w2_images_s"] / bound,
        }
        return figures
    finally:
        group.rmdir()


def distinct_labels(
    quasi: bool, batch: int, records: int, record_bytes: int, classes: int
) -> float:
    """Runs in a tree's process: the mean number of classes in a batch over a pass of a DB sorted
    by class (record i of class i * classes // records), read in the tree's quasi-random order
    (runs sized as --read_order sizes them) or in random order."""
    import numpy as np

    from resnet50_trainer.data.order import RecordOrder
    from resnet50_trainer.data.settings import resolve_read_order

    asked = "quasi_random" if quasi else "random"
    order = resolve_read_order(asked, records, records * record_bytes, 2**40)
    labels = np.array(RecordOrder(records, 0, *order.shape).records_at(range(records)))
    batches = (labels * classes // records)[: records // batch * batch].reshape(-1, batch)
    return float(np.mean([len(np.unique(row)) for row in batches]))


@benchmark(
    "label_mix",
    "Classes in a batch of a DB sorted by class",
    (
        Figure(
            "quasi_random_label_mix",
            "x",
            HIGHER,
            0.85,
            0.05,
            "classes in a batch of 256 over a pass of an ImageNet-shaped DB sorted by class "
            "(1,281,167 records of 110 KB, 1,000 classes), quasi-random order against random "
            "order: mean over the pass's batches, a ratio",
        ),
        Figure("random_classes_per_batch", "classes", HIGHER, None, 0.05, "random order"),
        Figure("quasi_random_classes_per_batch", "classes", HIGHER, None, 0.05, "quasi-random"),
    ),
    rounds=(1, 1),
    order=30,
)
def measure_label_mix(context: Context, tree: Tree) -> dict[str, float]:
    shape = dict(batch=256, records=1_281_167, record_bytes=110_000, classes=1000)
    random_order = float(tree.call("benchmarks.cold_reads:distinct_labels", quasi=False, **shape))
    quasi = float(tree.call("benchmarks.cold_reads:distinct_labels", quasi=True, **shape))
    return {
        "quasi_random_label_mix": quasi / random_order,
        "random_classes_per_batch": random_order,
        "quasi_random_classes_per_batch": quasi,
    }
