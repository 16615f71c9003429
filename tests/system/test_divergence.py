"""A run whose loss or weights stop being finite stops with one line naming the iteration, exit 1,
and never saves over the last good checkpoint; a float16 step the gradient scaler skips is no
divergence. Real runs on the CPU (1 and 2 processes) with a learning rate of 1e30."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from resnet50_trainer.model.precision import Precision, PrecisionSettings
from resnet50_trainer.model.resnet import build_model
from resnet50_trainer.train.divergence import DivergenceWatch
from tests.support.dbfactory import write_image_db
from tests.support.trainer_runs import SMALL_RUN, config_of, one_error_line, run_trainer

HUGE_LR = ["--base_learning_rate", "1e30"]  # effective 3e28: the first step blows the weights up


@pytest.fixture(scope="module")
def small_db(module_tmp_path):
    return write_image_db(str(module_tmp_path / "db"), 32, 4)  # 4 steps


def good_first_epoch(database: str, out, processes: int) -> bytes:
    done = run_trainer(
        "--train_data",
        database,
        "--num_gpus",
        str(processes),
        "--num_epochs",
        "1",
        "--log_dir",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    return (out / "resnet50_model_1.pt").read_bytes()


def checkpoints(directory) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".pt") or ".tmp-" in name)


def diverge(database: str, out, processes: int, *args: str) -> str:
    """Epochs 2 and 3 at HUGE_LR, resumed from `out`: the run fails (status 1); its error line."""
    diverged = run_trainer(
        *("--train_data", database, "--num_gpus", str(processes), "--num_epochs", "3"),
        *("--load_model_path", str(out), "--log_dir", str(out), *HUGE_LR, *args),
    )
    assert diverged.returncode == 1, diverged.stderr
    return one_error_line(diverged.stderr)


@pytest.mark.parametrize("processes", [1, 2])
def test_a_diverged_run_stops_naming_the_iteration_and_keeps_the_last_good_checkpoint(
    small_db, tmp_path, processes
):
    good = good_first_epoch(small_db, tmp_path, processes)
    # Checked at the epoch's end only (--print_every 1000): the loss first went nan at step 2.
    line = diverge(small_db, tmp_path, processes, "--keep_checkpoints", "1")
    assert line.endswith(
        "error: training diverged: the loss was no longer finite (inf or nan) at iteration 6 "
        "(epoch 2, step 2); "
        f"the last good checkpoint {tmp_path / 'resnet50_model_1.pt'} is kept: lower "
        "--base_learning_rate or add --warmup_epochs, then resume with --load_model_path "
        f"{tmp_path}"
    )
    assert (tmp_path / "resnet50_model_1.pt").read_bytes() == good
    assert checkpoints(tmp_path) == ["resnet50_model_1.pt"]


def test_weights_are_checked_before_a_mid_epoch_checkpoint(small_db, tmp_path):
    good = good_first_epoch(small_db, tmp_path, 2)
    line = diverge(small_db, tmp_path, 2, "--checkpoint_every_iters", "1")
    assert (
        "the weights were no longer finite (inf, nan, or too large to square in float32) by "
        "iteration 5 (epoch 2, step 1)"
    ) in line
    assert (tmp_path / "resnet50_model_1.pt").read_bytes() == good
    assert checkpoints(tmp_path) == ["resnet50_model_1.pt"]


def test_a_run_that_diverges_before_any_checkpoint_stops_at_the_next_print(small_db, tmp_path):
    diverged = run_trainer(
        "--train_data",
        small_db,
        "--num_epochs",
        "3",
        "--print_every",
        "2",
        "--log_dir",
        str(tmp_path),
        *HUGE_LR,
    )
    assert diverged.returncode == 1, diverged.stderr
    line = one_error_line(diverged.stderr)
    assert "iteration 2 (epoch 1, step 2); no checkpoint was written: lower" in line
    assert checkpoints(tmp_path) == []


@pytest.fixture
def process_group(tmp_path):
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def test_a_float16_step_the_scaler_skips_is_no_divergence(process_group):
    """The scaler's CPU twin of the GPU path: gradients that overflow the scale are skipped, the
    loss (float32) stays finite, the weights stay as they were."""
    settings = PrecisionSettings.of(config_of("--train_data", "null", *SMALL_RUN))
    precision = Precision(dataclasses.replace(settings, dtype="float16"), torch.device("cpu"))
    precision.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)  # overflows every gradient
    model = build_model(18, 4, 3)
    before = [parameter.detach().clone() for parameter in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = DivergenceWatch(model, torch.device("cpu"), torch.device("cpu"))
    with precision.autocast():
        loss = F.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 3]))
    precision.backward(loss)
    precision.step(optimizer)
    watch.record(loss, 1)
    assert precision.scaler.get_scale() < 2.0**127  # the step was skipped
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert watch.check() == (None, True, False, False)
    watch.record(torch.tensor(float("nan")), 2)
    watch.record(torch.tensor(float("inf")), 3)
    assert watch.check() == (2, True, False, False)  # the first non-finite loss is named
