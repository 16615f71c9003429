"""--grad_compression, for real, on CPU with 2 processes over Gloo: the casting hooks train, and
PowerSGD's state (every process's error feedback, the factors, the generator) goes into checkpoints,
so that a run resumed mid-epoch ends bitwise equal to the uninterrupted one (as
tests/system/test_resume.py shows for plain runs). Then what a resume cannot carry over is warned
of, and what cannot work is refused in one line."""

from __future__ import annotations

import math

import pytest
import torch
import torchvision

from resnet50_trainer.checkpoint import files as checkpoint_files
from resnet50_trainer.errors import UserError
from tests.support.dbfactory import write_image_db
from tests.support.trainer_runs import config_of, log_rows, refused_in_process, run_trainer

# 32 records, global batch 8: 4 steps an epoch; PowerSGD from iteration 2, a checkpoint every 3
# iterations: iteration 9 is step 1 of epoch 3, 7 steps into compression.
RECORDS = 32
POWERSGD = ("--grad_compression", "powersgd", "--powersgd_start_iter", "2")


def three_epochs_on_two_processes(database: str, out, *args: str):
    return run_trainer(
        *("--train_data", database, "--num_gpus", "2", "--num_epochs", "3", "--log_dir", str(out)),
        *args,
    )


@pytest.fixture(scope="module")
def uninterrupted(module_tmp_path):
    root = module_tmp_path
    database = write_image_db(str(root / "db"), RECORDS, 4)
    out = root / "uninterrupted"
    done = three_epochs_on_two_processes(
        database, out, *POWERSGD, "--checkpoint_every_iters", "3", "--keep_checkpoints", "10"
    )
    assert done.returncode == 0, done.stderr
    assert "Gradient all-reduce: PowerSGD at rank 2 from iteration 2" in done.stderr
    return database, out


def test_checkpoint_holds_every_process_s_error_feedback(uninterrupted):
    _, out = uninterrupted
    state = torch.load(out / "resnet50_model_2_step1.pt", weights_only=True)
    entry = state["grad_compression"]
    parameters = sum(p.numel() for p in torchvision.models.resnet18(num_classes=4).parameters())
    errors = entry["errors"]
    assert errors.shape == (2, parameters)  # one row per process
    assert not torch.equal(errors[0], errors[1])  # each process keeps what it left out
    assert entry["mode"] == "powersgd" and entry["rank"] == 2 and entry["factors"]
    assert all(q.shape[1] <= 2 for q in entry["factors"].values())


def test_resume_mid_epoch_equals_uninterrupted(uninterrupted, tmp_path):
    database, out = uninterrupted
    done = three_epochs_on_two_processes(
        database, tmp_path, *POWERSGD, "--load_model_path", str(out / "resnet50_model_2_step1.pt")
    )
    assert done.returncode == 0, done.stderr
    assert log_rows(tmp_path)[-1]["loss"] == log_rows(out)[2]["loss"]
    expected = torch.load(out / "resnet50_model_3.pt", weights_only=True)
    resumed = torch.load(tmp_path / "resnet50_model_3.pt", weights_only=True)
    for name, tensor in expected["model"].items():
        assert torch.equal(tensor, resumed["model"][name]), name
    assert torch.equal(
        expected["grad_compression"]["errors"], resumed["grad_compression"]["errors"]
    )


def test_resume_on_one_process_drops_the_error_feedback_with_a_warning(uninterrupted, tmp_path):
    database, out = uninterrupted
    done = run_trainer(
        *("--train_data", database, "--num_gpus", "1", "--num_epochs", "3", *POWERSGD),
        *("--log_dir", str(tmp_path), "--load_model_path", str(out / "resnet50_model_2_step1.pt")),
    )
    assert done.returncode == 0, done.stderr
    assert "holds the PowerSGD error feedback of 2 processes, this run has 1" in done.stderr
    assert (
        torch.load(tmp_path / "resnet50_model_3.pt", weights_only=True)["grad_compression"][
            "errors"
        ].shape[0]
        == 1
    )


def test_resume_without_compression_warns_that_the_state_is_dropped(uninterrupted, tmp_path):
    database, out = uninterrupted
    done = three_epochs_on_two_processes(
        database, tmp_path, "--load_model_path", str(out / "resnet50_model_2_step1.pt")
    )
    assert done.returncode == 0, done.stderr
    assert (
        "was made with --grad_compression powersgd, this run uses none: its PowerSGD state "
        "(error feedback, factors) is dropped"
    ) in done.stderr
    saved = torch.load(tmp_path / "resnet50_model_3.pt", weights_only=True)
    assert saved["grad_compression"] == {"mode": "none"}


@pytest.mark.parametrize("mode, named", [("fp16", "float16"), ("bf16", "bfloat16")])
def test_casting_hooks_train_on_gloo(image_db, tmp_path, mode, named):
    database = image_db("train", 16, 4)
    done = run_trainer(
        *("--train_data", database, "--num_gpus", "2", "--num_epochs", "1"),
        *("--log_dir", str(tmp_path), "--grad_compression", mode),
    )
    assert done.returncode == 0, done.stderr
    assert f"Gradient all-reduce: {named} buckets" in done.stderr
    assert "Parameters identical on all 2 processes" in done.stderr
    assert math.isfinite(float(log_rows(tmp_path)[0]["loss"]))


def test_an_altered_powersgd_state_is_refused_in_one_line(uninterrupted, tmp_path):
    _, out = uninterrupted
    state = torch.load(out / "resnet50_model_2_step1.pt", weights_only=True)
    state["grad_compression"]["errors"][1, 7] = math.nan
    altered = tmp_path / "resnet50_model_2_step1.pt"
    torch.save(state, altered)
    with pytest.raises(UserError, match="PowerSGD error feedback that is not finite"):
        checkpoint_files.load_checkpoint(str(altered), "resnet50_model")


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--powersgd_rank", "4"], "add --grad_compression powersgd or leave --powersgd_rank out"),
        (["--grad_compression", "fp16", "--powersgd_start_iter", "10"], "--powersgd_start_iter"),
        (["--grad_compression", "powersgd", "--powersgd_start_iter", "1"], "from 2"),
        (["--grad_compression", "int8"], "invalid choice"),
    ],
)
def test_settings_that_cannot_work_are_refused_in_one_line(capsys, flags, named):
    line = refused_in_process(capsys, "--train_data", "null", *flags)
    assert named in line


@pytest.mark.parametrize("precision", [["--dtype", "float16"], ["--float16_compute"]])
def test_powersgd_with_float16_training_is_refused_on_a_gpu_machine(precision):
    # On the CPU float16 is refused first; the GPU machine's config reaches this check.
    flags = ["--train_data", "null", "--grad_compression", "powersgd", *precision]
    with pytest.raises(UserError, match="inf gradients would stay in PowerSGD's error feedback"):
        config_of(*flags, gpus_present=1)
    assert config_of(*flags[: -len(precision)], "--dtype", "bfloat16", gpus_present=1)


def test_a_powersgd_state_of_another_model_is_refused_before_the_run(
    uninterrupted, tmp_path, capsys
):
    database, out = uninterrupted
    state = torch.load(out / "resnet50_model_2_step1.pt", weights_only=True)
    state["grad_compression"]["errors"] = torch.zeros(2, 5)
    torch.save(state, tmp_path / "resnet50_model_2_step1.pt")
    line = refused_in_process(
        capsys,
        *("--train_data", database, "--num_gpus", "2", "--log_dir", str(tmp_path / "logs")),
        *(*POWERSGD, "--load_model_path", str(tmp_path / "resnet50_model_2_step1.pt")),
    )
    assert "PowerSGD error feedback of shape (2, 5)" in line
    assert not list((tmp_path / "logs").glob("*.log"))  # refused before the run began
