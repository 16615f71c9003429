"""--crop random_resized's bounds in a real run: they reach the Config and the run log."""

from __future__ import annotations

import re

from tests.support.trainer_runs import read_log, run_trainer


def test_random_resized_bounds_reach_the_config_and_the_log(image_db, tmp_path):
    """A short real run of random-resized crops with bounds of its own and a test at other sizes:
    it trains, tests, and its log's first line holds the settings."""
    train, test = image_db("train", 16, 4), image_db("test", 8, 4)
    result = run_trainer(
        *("--train_data", train, "--test_data", test, "--num_epochs", "1"),
        *("--crop", "random_resized", "--crop_area", "0.25,1", "--crop_ratio", "0.5,2"),
        *("--test_resize", "40", "--test_image_size", "36", "--log_dir", str(tmp_path)),
    )
    assert result.returncode == 0, result.stderr
    assert re.search(r"test accuracy [0-9.]+, test top-5 [0-9.]+ over 8 images", result.stderr)
    _, first_line, rows = read_log(tmp_path)
    assert "crop='random_resized', crop_area=[0.25, 1.0], crop_ratio=[0.5, 2.0]" in first_line
    assert "test_resize=40, test_image_size=36" in first_line and float(rows[0]["loss"]) > 0
