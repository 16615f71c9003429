"""--recipe caffe2 against --recipe modern on the bundled sample data: the README's first command
(2 CPU processes, ResNet-50 at 32 px, 10 classes) run once per recipe, everything else equal;
prints each epoch's test accuracy (the model's; and the EMA's, from the console) and images/s
from the run logs. Usage: python -m benchmarks.recipes [--num_epochs 6] [extra flags]"""

from __future__ import annotations

import argparse
import csv
import glob
import os
import re
import subprocess
import sys
import tempfile

from resnet50_trainer.config.recipes import RECIPES

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_RUN = [
    *("--train_data", os.path.join(REPO, "sample_data", "train_lmdb")),
    *("--test_data", os.path.join(REPO, "sample_data", "test_lmdb")),
    *("--num_labels", "10", "--use_cpu", "--num_gpus", "2", "--batch_size", "32"),
    *("--image_size", "32", "--base_learning_rate", "0.05"),
]
EMA_ACCURACY = re.compile(r"EMA test accuracy ([0-9.]+)")


def run(recipe: str, epochs: int, extra: list[str], out: str) -> None:
    command = [sys.executable, "-m", "resnet50_trainer", *README_RUN, "--recipe", recipe]
    command += ["--num_epochs", str(epochs), "--log_dir", out, *extra]
    done = subprocess.run(
        command, env={**os.environ, "PYTHONPATH": REPO}, capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(f"{recipe}: exit {done.returncode}\n{done.stderr[-2000:]}")
    with open(glob.glob(os.path.join(out, "*.log"))[0]) as log:
        rows = list(csv.DictReader(line for line in log if not line.startswith("#")))
    ema = EMA_ACCURACY.findall(done.stderr)
    print(f"--recipe {recipe}: " + " ".join(line for line in done.stderr.splitlines()[:1]))
    for index, row in enumerate(rows):
        print(
            f"  epoch {row['epoch']}: loss {float(row['loss']):.4f}, test accuracy "
            f"{row['test_accuracy']}{f', EMA {ema[index]}' if ema else ''}, lr "
            f"{float(row['learning_rate']):.5f}, {row['inputs_per_sec']} images/s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--num_epochs", type=int, default=6)
    args, extra = parser.parse_known_args()
    for recipe in RECIPES:
        with tempfile.TemporaryDirectory() as out:
            run(recipe, args.num_epochs, extra, out)


if __name__ == "__main__":
    main()
