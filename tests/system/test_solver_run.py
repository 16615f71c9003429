"""A --solver file in a real run: it says what each field became and logs what it drops."""

from __future__ import annotations

import pytest

from tests.support.solver_files import STEP_SOLVER, solver_file
from tests.support.trainer_runs import (
    log_rows,
    run_trainer,
)


def test_a_solver_run_says_what_each_field_became_and_logs_the_drops(tmp_path):
    text = STEP_SOLVER.replace("stepsize: 6", "stepsize: 4") + "iter_size: 2\nrandom_seed: 3\n"
    path = solver_file(tmp_path, text)
    done = run_trainer("--train_data", "null", "--solver", path, "--log_dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    for line in (
        "max_iter -> --num_epochs 3",
        "test_interval -> --epoch_size 32: epochs of 4 iterations of the global batch of 8",
        "stepsize -> --lr_steps 1 epochs",
        "iter_size -> --iter_size 2",
        "random_seed -> --seed 3",
        "net 'models/ResNet-50-train_val.prototxt': not used",
        "1 process x 8 images in 2 passes of 4",
    ):
        assert line in done.stderr, done.stderr
    rows = log_rows(tmp_path)
    assert [float(row["learning_rate"]) for row in rows] == pytest.approx([0.2, 0.1, 0.05])
    assert [int(row["cumulative_batch_count"]) for row in rows] == [4, 8, 12]
