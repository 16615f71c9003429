"""Training on a DB sorted by class: does quasi-random order reach random order's test accuracy?

The DB is the bundled sample data's training DB (sample_data/train_lmdb: 800 JPEGs of 10
classes in class order, as a DB made without --shuffle is). At 1.6 MB it is one 512 MB window, in
which quasi-random order is a full shuffle; `--read_window_mb 1` cuts it into windows of 2 runs of
251 records (2.5 classes a run), so that a batch of 32 holds about 7 classes against random
order's 10: a harsher mix than ImageNet's in its 512 MB windows (207 classes of 256 against 226,
`label_mix`). The job is the README's main one (ResNet-50 on 2 CPU processes, 32 px, batch 32, 6
epochs, base LR 0.05), tested on sample_data/test_lmdb after each epoch; each order trains with
two seeds and the figures are the mean best test accuracies.
"""

from __future__ import annotations

import csv
import glob
import os
import subprocess
import tempfile

from benchmarks.registry import HIGHER, LOWER, Context, Figure, benchmark
from benchmarks.trees import MeasurementFailed, Tree

SEEDS = (0, 1)
ORDERS = {
    "random": ("--read_order", "random"),
    "quasi_random": ("--read_order", "quasi_random", "--read_window_mb", "1"),
}


def best_test_accuracy(tree: Tree, order: str, seed: int, out: str) -> float:
    """The best test accuracy in the run log of `tree`'s README job read in `order`."""
    sample = tree.path / "sample_data"
    log_dir = tempfile.mkdtemp(dir=out, prefix=f"{order}_{seed}_")
    flags = [
        *("--train_data", str(sample / "train_lmdb"), "--test_data", str(sample / "test_lmdb")),
        *("--num_labels", "10", "--use_cpu", "--num_gpus", "2", "--batch_size", "32"),
        *("--image_size", "32", "--num_epochs", "6", "--base_learning_rate", "0.05"),
        *("--seed", str(seed), "--log_dir", log_dir, "--checkpoint_dir", log_dir),
        *ORDERS[order],
    ]
    run = subprocess.run(
        tree.trainer(flags), cwd=out, capture_output=True, text=True, env=tree.environment()
    )
    if run.returncode:
        raise MeasurementFailed(
            f"resnet50-trainer failed ({run.returncode}):\n{run.stderr[-3000:]}"
        )
    [log_path] = glob.glob(os.path.join(log_dir, "*.log"))
    with open(log_path) as log_file:
        rows = list(csv.DictReader(line for line in log_file if not line.startswith("#")))
    return max(float(row["test_accuracy"]) for row in rows)


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
            "random order's best test accuracy less quasi-random order's, on the sample data's "
            "training DB (in class order) cut by --read_window_mb 1 into windows of 2 runs "
            "(batches of 7 classes of 10); README's main job, mean of 2 seeds",
            floor=0.02,
        ),
        Figure(
            "sorted_random_accuracy", "accuracy", HIGHER, None, 0.02, "random order", floor=0.02
        ),
        Figure(
            "sorted_quasi_random_accuracy",
            "accuracy",
            HIGHER,
            None,
            0.02,
            "quasi-random order, 1 MB windows",
            floor=0.02,
        ),
    ),
    rounds=(1, 1),
)
def measure_sorted_db(context: Context, tree: Tree) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=context.scratch) as out:
        accuracy = {
            order: sum(best_test_accuracy(tree, order, seed, out) for seed in SEEDS) / len(SEEDS)
            for order in ORDERS
        }
    return {
        "sorted_quasi_random_accuracy_gap": accuracy["random"] - accuracy["quasi_random"],
        "sorted_random_accuracy": accuracy["random"],
        "sorted_quasi_random_accuracy": accuracy["quasi_random"],
    }
