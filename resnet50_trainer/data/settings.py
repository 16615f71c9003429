"""What the input pipeline needs of a run's settings, passed whole to the parts that build it."""

from __future__ import annotations

import os
from dataclasses import dataclass

# --crop: scale, the original's (shorter side to --scale, a random square); random_resized,
# torchvision's RandomResizedCrop, with its defaults for --crop_area and --crop_ratio.
SCALE_CROP = "scale"
RANDOM_RESIZED_CROP = "random_resized"
CROPS = (SCALE_CROP, RANDOM_RESIZED_CROP)
DEFAULT_CROP_AREA = (0.08, 1.0)
DEFAULT_CROP_RATIO = (3 / 4, 4 / 3)
CROP_BOUNDS = ("crop_area", "crop_ratio")  # the flags of random_resized's bounds
# The crop is this share of the resized shorter side by default: 224 of 256.
CROP_SHARE = 0.875


def default_scale(image_size: int) -> int:
    """--scale's default: round(image_size / 0.875), 256 for 224."""
    return round(image_size / CROP_SHARE)


# --read_order: the order of each pass over the training DB (data/order.py). random: any record
# anywhere; quasi_random: runs of consecutive records (RUN_BYTES each) in a random order, shuffled
# within windows of runs (--read_window_mb of them), so that storage serves whole runs; auto:
# quasi_random when the DB is more than half of a machine's memory (it cannot stay in the page
# cache), else random.
RANDOM_ORDER = "random"
QUASI_RANDOM_ORDER = "quasi_random"
AUTO_ORDER = "auto"
READ_ORDERS = (AUTO_ORDER, RANDOM_ORDER, QUASI_RANDOM_ORDER)
RUN_BYTES = 2**19  # 512 KB: one request, large enough for a disk or NFS to serve at speed
DEFAULT_WINDOW_MB = 512  # 1,024 runs of 512 KB shuffled together, held in the page cache


def window_mb_of(read_window_mb: int | None) -> int:
    """--read_window_mb, or its default."""
    return read_window_mb or DEFAULT_WINDOW_MB


@dataclass(frozen=True)
class ReadOrder:
    """The order a run reads its training DB in: runs of consecutive records (1: random order)
    shuffled in windows of `window_runs` runs (describe_order names it), and why (the run's
    start line)."""

    run_length: int
    window_runs: int
    why: str = ""

    @property
    def shape(self) -> tuple[int, int]:
        """(run_length, window_runs): what a checkpoint records of the order its epoch read in."""
        return self.run_length, self.window_runs


def describe_order(run_length: int, window_runs: int) -> str:
    """An order by its shape, as the start line and a resume name it."""
    if run_length == 1:
        return RANDOM_ORDER
    runs = f"runs of {run_length} records shuffled in windows of {window_runs} runs"
    return f"{QUASI_RANDOM_ORDER}, {runs}"


def resolve_read_order(
    asked: str,
    num_records: int,
    db_bytes: int,
    memory: int,
    larger_elsewhere: bool = False,
    window_mb: int = DEFAULT_WINDOW_MB,
) -> ReadOrder:
    """--read_order for a DB of `db_bytes` in `num_records` records on a machine of `memory`
    bytes; `larger_elsewhere`: another machine of the run cannot hold the DB in half its memory;
    `window_mb`: --read_window_mb."""
    large_here = db_bytes > memory / 2
    if asked == AUTO_ORDER:
        quasi = large_here or larger_elsewhere
        where = (
            f"{'more' if large_here else 'less'} than half this machine's {memory / 2**30:.0f} GiB"
            if large_here or not larger_elsewhere
            else "more than half of another machine's memory"
        )
        why = f"--read_order auto: the DB's {db_bytes / 2**30:.1f} GiB is {where}"
    else:
        quasi, why = asked == QUASI_RANDOM_ORDER, f"--read_order {asked}"
    if not quasi:
        return ReadOrder(1, 1, why)
    record_bytes = max(1.0, db_bytes / max(1, num_records))
    run_length = max(1, min(num_records, round(RUN_BYTES / record_bytes)))
    if run_length == 1:
        return ReadOrder(1, 1, why)
    window_bytes = window_mb * 2**20
    if memory / 2 < window_bytes < db_bytes:
        why += (
            f"; a window of {window_mb} MB cannot stay in half this machine's memory, so its runs "
            "are read twice: lower --read_window_mb"
        )
    return ReadOrder(run_length, max(1, window_bytes // RUN_BYTES), why)


def database_bytes(path: str) -> int:
    """The size of the DB's files: LMDB's data.mdb, LevelDB's tables and logs."""
    return sum(entry.stat().st_size for entry in os.scandir(path) if entry.is_file())


def memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class InputSettings:
    """How records become batches: what the trainer's flags say, or `resnet50-db bench` asks.
    The test images' settings hold the test sizes and the scale crop, which they are centred by."""

    num_labels: int
    num_channels: int
    scale: int  # shorter side before cropping (the scale crop, and every test image)
    image_size: int  # crop side
    seed: int  # of the crops
    num_workers: int  # input processes (0: the training process itself)
    decode_on_gpu: bool
    crop: str = SCALE_CROP  # a training crop of CROPS
    crop_area: tuple[float, float] = DEFAULT_CROP_AREA  # random_resized: share of the image's area
    crop_ratio: tuple[float, float] = DEFAULT_CROP_RATIO  # random_resized: width / height

    def describe_decoding(self, training_processes: int = 1) -> str:
        """The start line's words: where JPEGs are decoded, by how many processes (each training
        process's, of `training_processes` on this machine)."""
        each = " per training process" if training_processes > 1 else ""
        readers = (
            f"{self.num_workers} input process{'es' * (self.num_workers != 1)}{each}"
            if self.num_workers
            else f"the training process{'es' * (training_processes > 1)}"
        )
        if self.decode_on_gpu:
            return f"JPEGs decoded on the GPU (nvJPEG), read by {readers}"
        return f"images decoded by {readers}"
