"""`resnet50-db bench DB`: the training input pipeline alone, in images per second.

The same pipeline the trainer builds (device_batches: seeded record order, input processes,
uint8 crops, pinned batches, the device prefetcher), read for --batches batches after one warm-up
batch (which pays for starting the input processes). No model runs. Registered in resnet50-db's
subcommands with `register(parser)`; also runnable alone as
`python -m resnet50_trainer.tools.db.bench DB ...`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from resnet50_trainer.commands import run_command
from resnet50_trainer.config.flags.data import READ_ORDER_FLAGS, DataFlags
from resnet50_trainer.config.flags.declare import add_flags
from resnet50_trainer.config.parsing import OneLineParser
from resnet50_trainer.config.shared_checks import check_read_window, resolve_scale
from resnet50_trainer.config.values import (
    BATCH_SIZE,
    INPUT_WORKERS,
    PIXELS,
    SEED,
    Number,
    path_value,
)
from resnet50_trainer.data.formats.databases import check_database_path, detect_db_type, read_keys
from resnet50_trainer.data.formats.db_types import DB_TYPES, LMDB
from resnet50_trainer.data.formats.keys import printable_key
from resnet50_trainer.data.settings import CROPS, SCALE_CROP, window_mb_of
from resnet50_trainer.errors import UserError
from resnet50_trainer.launch.probes import check_torch_loads
from resnet50_trainer.streams import guard_standard_streams, log_lines

if TYPE_CHECKING:
    import torch

    from resnet50_trainer.data.order import ShardBatchSampler

ANY_LABEL = 2**31 - 1  # the bench reads any label; the trainer checks them against --num_labels

HELP = "time the training input pipeline alone (images/s)"
DESCRIPTION = (
    "Run the training input pipeline (decode, crop, batch, copy to the device) without a model "
    "and print images per second; last line: 'images/sec: X'."
)


def register(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser)
    parser.set_defaults(run=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("db", type=path_value, help="LMDB or LevelDB directory of image records")
    parser.add_argument(
        "--db_type",
        choices=DB_TYPES,
        help="database type (default: detected from the directory)",
    )
    parser.add_argument("--batch_size", type=BATCH_SIZE, default=256, help="images per batch")
    parser.add_argument("--image_size", type=PIXELS, default=224, help="crop size in pixels")
    parser.add_argument(
        "--scale",
        type=PIXELS,
        help="shorter side before cropping (default: round(image_size / 0.875), as the trainer)",
    )
    parser.add_argument(
        "--crop",
        default=SCALE_CROP,
        choices=CROPS,
        help="training crop, as the trainer's --crop (random_resized: its default bounds)",
    )
    parser.add_argument(
        "--num_channels", type=int, default=3, choices=(1, 3), help="colour channels"
    )
    parser.add_argument(
        "--num_workers", type=INPUT_WORKERS, default=2, help="input processes (0: in this one)"
    )
    parser.add_argument(
        "--batches",
        type=Number(int, 1, 1_000_000),
        default=20,
        help="batches timed, after one warm-up",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        choices=("cpu", "cuda"),
        help="where batches end up (cuda adds the pinned copy and the prefetcher)",
    )
    parser.add_argument(
        "--decode_device",
        default="cpu",
        choices=("cpu", "gpu"),
        help="gpu: input processes only read bytes; JPEGs are decoded on --device cuda",
    )
    add_flags(parser, DataFlags, READ_ORDER_FLAGS)
    parser.add_argument("--seed", type=SEED, default=0, help="seed of the order and the crops")


def run(args: argparse.Namespace) -> int:
    rate = bench(args)
    print(f"images/sec: {rate:.1f}")
    return 0


def bench(
    args: argparse.Namespace,
    rank: int = 0,
    world_size: int = 1,
    start: Callable[[], None] | None = None,
) -> float:
    """Images per second over args.batches batches after a warm-up batch, read as process `rank`
    of a run of `world_size` training processes would (each reads its share of one stream).

    `start`, where given, is called once all is ready but the first batch, and the timing begins
    as it returns and counts every batch, the first too: the warm-up batch's reads of the DB are
    timed. benchmarks/cold_reads.py passes one that drops the DB from the page cache, and, for
    processes timed together, waits for the others."""
    # torch only here: `resnet50-db --help` and the other subcommands start without it.
    check_torch_loads()
    from resnet50_trainer.data.input_pipeline import device_batches
    from resnet50_trainer.data.settings import InputSettings

    device = _device(args)
    db_type = args.db_type or detect_db_type(args.db) or LMDB
    check_database_path(args.db, db_type)
    scale = resolve_scale(args.image_size, args.scale)
    keys = read_keys(args.db, db_type)
    sampler = _records_in_trainers_order(args, db_type, keys, rank, world_size)
    settings = InputSettings(
        ANY_LABEL,
        args.num_channels,
        scale,
        args.image_size,
        args.seed,
        args.num_workers,
        args.decode_device == "gpu",
        crop=args.crop,
    )
    if start is not None:
        start()
    started = time.perf_counter()
    batches = iter(device_batches(args.db, db_type, keys, sampler, device, settings, train=True))
    if start is None:
        next(batches)  # warm-up: input processes start, the DB opens
        _synchronize(device)
        started = time.perf_counter()
    images, bad_keys = 0, []
    for batch in batches:  # a bad record's place is filled with a copy: not counted
        images += batch.num_real
        bad_keys += batch.bad_keys
    _synchronize(device)
    elapsed = time.perf_counter() - started
    if bad_keys:
        print(
            f"skipped {len(bad_keys)} records that cannot be read (the first: "
            f"{printable_key(bad_keys[0])}; resnet50-db inspect says why)"
        )
    return images / elapsed


def _records_in_trainers_order(
    args: argparse.Namespace, db_type: str, keys: Sequence[bytes], rank: int, world_size: int
) -> ShardBatchSampler:
    """The records process `rank` reads, in the trainer's order (--read_order resolved and said,
    a poor mix of labels warned of), wrapping around the DB as often as the batches need."""
    from resnet50_trainer.data.label_mix import poor_mix_warning
    from resnet50_trainer.data.order import RecordOrder, ShardBatchSampler
    from resnet50_trainer.data.settings import (
        database_bytes,
        describe_order,
        memory_bytes,
        resolve_read_order,
    )

    check_read_window(args.read_order, args.read_window_mb)
    window = window_mb_of(args.read_window_mb)
    order = resolve_read_order(
        args.read_order, len(keys), database_bytes(args.db), memory_bytes(), window_mb=window
    )
    print(f"read order {describe_order(*order.shape)} ({order.why})")
    sampler = ShardBatchSampler(
        RecordOrder(len(keys), args.seed, *order.shape),
        args.batches + 1,  # the warm-up batch too
        args.batch_size * world_size,
        args.batch_size,
        rank,
    )
    mix = poor_mix_warning(args.db, db_type, keys, sampler.order, window, sampler.global_batch)
    if mix:
        print(f"Warning: {mix}")
    return sampler


def _device(args: argparse.Namespace) -> torch.device:
    import torch

    if args.decode_device == "gpu" and args.device != "cuda":
        raise UserError("--decode_device gpu decodes on the GPU: add --device cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda but no GPU found on this machine: use --device cpu")
    return torch.device(args.device)


def _synchronize(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: Sequence[str] | None = None) -> int:
    guard_standard_streams("resnet50-db bench")  # --help and a refused argument write too
    log_lines(logging.INFO)
    parser = OneLineParser(prog="resnet50-db bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    return run_command("resnet50-db bench", lambda: run(args))


if __name__ == "__main__":
    sys.exit(main())
