"""Training on a DB sorted by class: does quasi-random order reach random order's test accuracy?

A DB made without --shuffle is in class order. ImageNet's, read quasi-randomly, is runs of about
5 records (a class holds 1,300) in windows of 1,024 runs spread over the DB: a batch of 256 holds
223 classes against random order's 226 (label_mix), and a window about one run of every class.
This benchmark trains in that regime, small: the sample data (sample_data/: 800 training images
of 10 classes in class order, 200 test images) as raw 256x256 Datums (192 KB each: runs of 3
records, a class 80), read in windows of 64 MB (at most 128 runs; the DB's 267 make 3 windows of
89, each a run from every stretch of 3: a batch of 32 draws from about 27 runs, as a batch of 256
draws from 223 of ImageNet's 1,024, and a window holds every class), against random order. And
(harsh) with windows of 2 runs of 251 records: the sample data's own 2 KB JPEGs read with
--read_window_mb 1, batches of about 7 classes, where the start warns that the window cannot mix
the DB. The job is
the README's main one (ResNet-50 on 2 CPU processes, 32 px, batch 32, base LR 0.05) run for 8
epochs with a cosine LR, so that its last epochs settle (at a constant LR one order's best test
accuracy moved by 0.2 between two seeds), tested after each epoch. Random and quasi-random order
train with the same 4 seeds (the same initial weights: the gap is paired by seed), the harsh case
with 2; the figures are the mean best test accuracies, and the gap's standard error over seeds.
"""

from __future__ import annotations

import csv
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.registry import HIGHER, LOWER, Context, Figure, benchmark
from benchmarks.startup import put_in_place
from benchmarks.trees import BENCHMARKS_ROOT, MeasurementFailed, Tree

SIDE = 256  # raw pixels: 192 KB a record, runs of 3
# name: (DB, order flags, seeds)
RUNS = {
    "random": ("raw", ("--read_order", "random"), (0, 1, 2, 3)),
    "quasi_random": (
        "raw",
        ("--read_order", "quasi_random", "--read_window_mb", "64"),
        (0, 1, 2, 3),
    ),
    "harsh": ("jpeg", ("--read_order", "quasi_random", "--read_window_mb", "1"), (0, 1)),
}


def raw_dbs(context: Context) -> Path:
    return context.data / "sorted_db" / f"raw_{SIDE}"


def make_raw_dbs(context: Context) -> None:
    target = raw_dbs(context)
    if target.is_dir():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    building = tempfile.mkdtemp(dir=target.parent, prefix=".raw.")
    try:
        Tree("this", BENCHMARKS_ROOT).call("benchmarks.sorted_db:build", out=building)
        put_in_place(Path(building), target)
    finally:
        shutil.rmtree(building, ignore_errors=True)


def build(out: str) -> None:
    """Runs in this checkout's process: sample_data's train and test LMDBs as raw SIDE x SIDE
    Datums, the same keys (class order) and labels."""
    import numpy as np
    from PIL import Image

    from resnet50_trainer.data.formats.databases import open_database
    from resnet50_trainer.data.formats.images import decode_native
    from resnet50_trainer.data.formats.records import DATUM, Record, parse_record, serialize_record
    from resnet50_trainer.data.formats.writers import open_writer

    for split in ("train_lmdb", "test_lmdb"):
        with (
            open_database(str(BENCHMARKS_ROOT / "sample_data" / split), "lmdb") as source,
            open_writer(os.path.join(out, split), "lmdb") as writer,
        ):
            for key, value in source.items():
                record = parse_record(bytes(value))
                image = (
                    decode_native(record)
                    .convert("RGB")
                    .resize((SIDE, SIDE), Image.Resampling.BILINEAR)
                )
                pixels = np.asarray(image)
                writer.put(bytes(key), serialize_record(Record(record.label, None, pixels, DATUM)))


def best_test_accuracy(tree: Tree, dbs: Path, run: str, seed: int, out: str) -> float:
    """The best test accuracy in the run log of `tree`'s README job on RUNS[run]."""
    kind, order, _ = RUNS[run]
    data = dbs if kind == "raw" else tree.path / "sample_data"
    log_dir = tempfile.mkdtemp(dir=out, prefix=f"{run}_{seed}_")
    flags = [
        *("--train_data", str(data / "train_lmdb"), "--test_data", str(data / "test_lmdb")),
        *("--num_labels", "10", "--use_cpu", "--num_gpus", "2", "--batch_size", "32"),
        *("--image_size", "32", "--num_epochs", "8", "--base_learning_rate", "0.05"),
        *("--lr_policy", "cosine"),
        *("--seed", str(seed), "--log_dir", log_dir, "--checkpoint_dir", log_dir, *order),
    ]
    done = subprocess.run(
        tree.trainer(flags), cwd=out, capture_output=True, text=True, env=tree.environment()
    )
    if done.returncode:
        raise MeasurementFailed(
            f"resnet50-trainer failed ({done.returncode}):\n{done.stderr[-3000:]}"
        )
    [log_path] = glob.glob(os.path.join(log_dir, "*.log"))
    with open(log_path) as log_file:
        rows = list(csv.DictReader(line for line in log_file if not line.startswith("#")))
    return max(float(row["test_accuracy"]) for row in rows)


def _accuracy(name: str, doc: str) -> Figure:
    return Figure(name, "accuracy", HIGHER, None, 0.02, doc, floor=0.02)


@benchmark(
    "sorted_db",
    "Training on a DB sorted by class",
    (
        Figure(
            "sorted_quasi_random_accuracy_gap",
            "accuracy",
            LOWER,
            0.05,
            0.02,
            "random order's best test accuracy less quasi-random order's, on the sample data in "
            "class order as raw 256x256 Datums (runs of 3 records, 64 MB windows: 3 of 89 runs, "
            "ImageNet's regime, small); README's main job for 8 epochs, cosine LR, mean of 4 "
            "seeds",
            floor=0.02,
        ),
        Figure(
            "sorted_quasi_random_accuracy_gap_stderr",
            "accuracy",
            LOWER,
            None,
            0.5,
            "the gap's standard error: of the 4 seeds' differences (each seed's two runs start "
            "from the same weights)",
            floor=0.02,
        ),
        _accuracy("sorted_random_accuracy", "random order"),
        _accuracy("sorted_quasi_random_accuracy", "quasi-random order, 64 MB windows"),
        _accuracy(
            "sorted_harsh_quasi_random_accuracy",
            "quasi-random order in windows of 2 runs of 251 records (the sample data's JPEGs, "
            "--read_window_mb 1: batches of 7 classes, windows of 5), where the start warns",
        ),
    ),
    prepare=make_raw_dbs,
    rounds=(1, 1),
    order=40,
)
def measure_sorted_db(context: Context, tree: Tree) -> dict[str, float]:
    dbs = raw_dbs(context)
    with tempfile.TemporaryDirectory(dir=context.scratch) as out:
        accuracies = {
            run: [best_test_accuracy(tree, dbs, run, seed, out) for seed in seeds]
            for run, (_, _, seeds) in RUNS.items()
        }
    print(f"sorted_db best test accuracies by seed: {accuracies}", file=sys.stderr)
    accuracy = {run: statistics.mean(values) for run, values in accuracies.items()}
    gaps = [r - q for r, q in zip(accuracies["random"], accuracies["quasi_random"])]
    return {
        "sorted_quasi_random_accuracy_gap": statistics.mean(gaps),
        "sorted_quasi_random_accuracy_gap_stderr": statistics.stdev(gaps) / len(gaps) ** 0.5,
        "sorted_random_accuracy": accuracy["random"],
        "sorted_quasi_random_accuracy": accuracy["quasi_random"],
        "sorted_harsh_quasi_random_accuracy": accuracy["harsh"],
    }
