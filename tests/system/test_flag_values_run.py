"""A flag value at its limit in a real run: an infinite timeout means no limit, and the run
trains."""

from __future__ import annotations

from tests.support.trainer_runs import log_rows, run_trainer


def test_an_infinite_timeout_means_no_limit_and_the_run_trains(image_db, tmp_path):
    """inf and the largest values each flag accepts, in one real two-process run: the timeout is
    shortened after the first step (where --timeout nan used to fail) and steps go on after it."""
    train = image_db("train", 32, 4)
    largest = {
        "--seed": 2**64 - 1,
        "--print_every": 10**30,
        "--keep_checkpoints": 10**30,
        "--checkpoint_every_iters": 10**30,
        "--warmup_epochs": 0.999,  # the largest below --num_epochs 1 (a longer one is refused)
    }
    result = run_trainer(
        "--train_data",
        train,
        "--num_gpus",
        "2",
        "--epoch_size",
        "32",
        "--num_epochs",
        "1",
        "--timeout",
        "inf",
        "--first_iter_timeout",
        "inf",
        "--log_dir",
        str(tmp_path),
        *(str(part) for item in largest.items() for part in item),
    )
    assert result.returncode == 0, result.stderr
    assert [row["epoch"] for row in log_rows(tmp_path)][-1] == "1"
