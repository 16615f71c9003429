"""--recipe caffe2 against --recipe modern on the bundled sample data: the README's first command
(2 CPU processes, ResNet-50 at 32 px, 10 classes) run once per recipe, everything else equal;
prints each epoch's test accuracy (the model's; and the EMA's, from the console) and images/s
from the run logs. Its figures (6 epochs): python -m benchmarks run --only recipes. Alone:
python -m benchmarks.recipes [--num_epochs 6] [extra flags]"""

from __future__ import annotations

import argparse
import csv
import glob
import os
import re
import statistics
import subprocess
import sys
import tempfile

from benchmarks.registry import HIGHER, LOWER, Context, Figure, benchmark
from benchmarks.trees import BENCHMARKS_ROOT, MeasurementFailed, Tree
from resnet50_trainer.config.recipes import RECIPES

SAMPLE_DATA = BENCHMARKS_ROOT / "sample_data"
README_RUN = [
    *("--train_data", str(SAMPLE_DATA / "train_lmdb")),
    *("--test_data", str(SAMPLE_DATA / "test_lmdb")),
    *("--num_labels", "10", "--use_cpu", "--num_gpus", "2", "--batch_size", "32"),
    *("--image_size", "32", "--base_learning_rate", "0.05"),
]
EMA_ACCURACY = re.compile(r"EMA test accuracy ([0-9.]+)")
EPOCHS = 6


def trained(recipe: str, epochs: int, extra: list[str], out: str, tree: Tree) -> dict:
    """The README's run under `recipe` in `tree`: its first line (`start`), its log's rows
    (`rows`) and each epoch's EMA test accuracy from the console (`ema`, where it keeps one)."""
    flags = [*README_RUN, "--recipe", recipe, "--num_epochs", str(epochs), "--log_dir", out]
    done = subprocess.run(
        tree.trainer([*flags, *extra]),
        cwd=out,
        env=tree.environment(),
        capture_output=True,
        text=True,
    )
    if done.returncode:
        raise MeasurementFailed(f"{recipe}: exit {done.returncode}\n{done.stderr[-2000:]}")
    with open(glob.glob(os.path.join(out, "*.log"))[0]) as log:
        rows = list(csv.DictReader(line for line in log if not line.startswith("#")))
    start = done.stderr.splitlines()[0] if done.stderr else ""
    return {"start": start, "rows": rows, "ema": EMA_ACCURACY.findall(done.stderr)}


def report(recipe: str, run: dict) -> None:
    print(f"--recipe {recipe}: {run['start']}")
    ema = run["ema"]
    for index, row in enumerate(run["rows"]):
        print(
            f"  epoch {row['epoch']}: loss {float(row['loss']):.4f}, test accuracy "
            f"{row['test_accuracy']}{f', EMA {ema[index]}' if ema else ''}, lr "
            f"{float(row['learning_rate']):.5f}, {row['inputs_per_sec']} images/s"
        )


def images_per_second(run: dict) -> float:
    return statistics.median(float(row["inputs_per_sec"]) for row in run["rows"])


@benchmark(
    "recipes",
    "Recipes on the sample data (README's run, 6 epochs, CPU)",
    (
        Figure(
            "recipe_modern_vs_caffe2_images_s",
            "x",
            HIGHER,
            None,
            0.15,
            "`--recipe modern`'s images/s over `--recipe caffe2`'s (each the median of its "
            "epochs' rates), the README's first run",
        ),
        Figure("recipe_caffe2_accuracy", "accuracy", HIGHER, None, 0.1, "caffe2's last test"),
        Figure("recipe_modern_accuracy", "accuracy", HIGHER, None, 0.1, "modern's last test"),
        Figure(
            "recipe_modern_ema_gap",
            "accuracy",
            LOWER,
            None,
            0.5,
            "modern's EMA's last test accuracy less the model's, as a distance",
            floor=0.02,
        ),
    ),
    rounds=(1, 2),
    order=80,
)
def measure_recipes(context: Context, tree: Tree) -> dict[str, float]:
    runs = {}
    for recipe in ("caffe2", "modern"):
        with tempfile.TemporaryDirectory(dir=context.scratch) as out:
            runs[recipe] = trained(recipe, EPOCHS, [], out, tree)
    last = {recipe: run["rows"][-1] for recipe, run in runs.items()}
    model, ema = float(last["modern"]["test_accuracy"]), float(runs["modern"]["ema"][-1])
    return {
        "recipe_modern_vs_caffe2_images_s": images_per_second(runs["modern"])
        / images_per_second(runs["caffe2"]),
        "recipe_caffe2_accuracy": float(last["caffe2"]["test_accuracy"]),
        "recipe_modern_accuracy": model,
        "recipe_modern_ema_gap": abs(ema - model),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num_epochs", type=int, default=EPOCHS)
    args, extra = parser.parse_known_args()
    this = Tree("this", BENCHMARKS_ROOT)
    for recipe in RECIPES:
        with tempfile.TemporaryDirectory() as out:
            try:
                report(recipe, trained(recipe, args.num_epochs, extra, out, this))
            except MeasurementFailed as failure:
                sys.exit(str(failure))


if __name__ == "__main__":
    main()
