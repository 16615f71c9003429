"""--auto_resume and torchrun's restarts, for real: `torchrun --max-restarts 1` with the c10d
rendezvous, 2 CPU processes, rank 1 SIGKILLed by tests/support/hooks/sitecustomize.py after its 7th
step in the first round; the restarted round resumes from the newest checkpoint and ends bitwise
equal to an uninterrupted run (as tests/system/test_resume.py's resumes do). Then what --auto_resume
continues, and what it refuses, on copies of that run's checkpoints."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from resnet50_trainer.checkpoint import files as checkpoint_files
from resnet50_trainer.checkpoint import ownership, schema
from resnet50_trainer.checkpoint.auto_resume import resume_path
from tests.support.dbfactory import write_image_db
from tests.support.redis_server import free_port
from tests.support.trainer_runs import (
    HOOKS,
    REPOSITORY,
    RUN_TIMEOUT_S,
    SMALL_RUN,
    config_of,
    files,
    launched,
    model_state,
    refused_in_process,
    run_trainer,
    trainer_command,
    trainer_env,
)

NAME = "resnet50_model"
# 32 records, global batch 8: 4 steps an epoch, 3 epochs; a checkpoint every 3 iterations. Rank 1
# dies after iteration 7, the step after the checkpoint of iteration 6 (epoch 1, step 2): the
# newest complete one, since the next (iteration 8) needs rank 1's step 8.
RECORDS, EPOCHS = 32, 3
KILLED_AFTER_STEPS = 7
RUN = ["--num_epochs", str(EPOCHS), "--checkpoint_every_iters", "3", "--keep_checkpoints", "10"]


def torchrun(out, *flags: str, **env: str) -> subprocess.CompletedProcess:
    """The trainer under `torchrun --nproc-per-node 2 --max-restarts 1`, meeting through the c10d
    rendezvous on a free port, logging and checkpointing into `out`."""
    command = trainer_command("--log_dir", str(out), *flags)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    launcher += ["--max-restarts", "1", "--rdzv-backend", "c10d"]
    launcher += ["--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
    return subprocess.run(
        [
            *launcher,
            *command[1:],
        ],  # torchrun in place of the interpreter: `... -m resnet50_trainer`
        env=trainer_env(**env),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def runs(module_tmp_path):
    """(database, uninterrupted run's directory, restarted run's directory, its output)."""
    root = module_tmp_path
    database = write_image_db(str(root / "db"), RECORDS, 4)
    flags = ["--train_data", database, *RUN, "--auto_resume"]
    uninterrupted = torchrun(root / "uninterrupted", *flags)
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    restarted = torchrun(
        root / "restarted",
        *flags,
        PYTHONPATH=os.pathsep.join([REPOSITORY, HOOKS]),
        RESNET50_TRAINER_TEST_KILL_AFTER_STEPS=f"1:{KILLED_AFTER_STEPS}",
    )
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    return database, root / "uninterrupted", root / "restarted", restarted.stderr


def test_a_restarted_round_resumes_and_ends_as_an_uninterrupted_run(runs):
    _, uninterrupted, restarted, output = runs
    assert "exitcode: -9" in output  # rank 1 was killed; torchrun restarted the round
    assert f"--auto_resume in {restarted}: no checkpoint {NAME}_*.pt there yet: a new run" in output
    assert f"--auto_resume in {restarted}: continuing this run" in output
    assert f"Resumed from {restarted / NAME}_1_step2.pt: epoch 1 done, 2 steps into" in output
    expected = model_state(uninterrupted / f"{NAME}_{EPOCHS}.pt")
    resumed = model_state(restarted / f"{NAME}_{EPOCHS}.pt")
    assert expected.keys() == resumed.keys()
    for name in expected:
        assert torch.equal(expected[name], resumed[name]), name


def test_the_restarted_round_continued_the_runs_lineage(runs):
    _, _, restarted, _ = runs
    lineages = {ownership.read_lineage(saved.path) for saved in checkpoint_of(restarted)}
    assert len(lineages) == 1


def checkpoint_of(directory) -> list[checkpoint_files.Saved]:
    return checkpoint_files.saved_checkpoints(str(directory), NAME)


def test_torchrun_rounds_keep_their_keys_apart():
    """Each round's process group writes under keys of its own on the agent's store."""
    torchrun_env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
    prefixes = {
        launched({**torchrun_env, "WORLD_SIZE": world, **restart}).round_prefix
        for world in ("2", "4")
        for restart in ({}, {"TORCHELASTIC_RESTART_COUNT": "1"})
    }
    assert len(prefixes) == 4
    srun = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}
    assert launched({**srun, "SLURM_STEP_TASKS_PER_NODE": "2"}).round_prefix == ""


def test_its_own_checkpoints_win_over_load_model_path(runs, tmp_path):
    """--auto_resume: the run's own newest checkpoint, else --load_model_path, else a new run."""
    _, uninterrupted, _, _ = runs
    first = str(uninterrupted / f"{NAME}_1.pt")
    flags = [*SMALL_RUN, "--train_data", "null", "--log_dir", str(tmp_path), "--auto_resume"]
    assert resume_path(config_of(*flags)) is None
    assert resume_path(config_of(*flags, "--load_model_path", first)) == first
    (tmp_path / f".tmp-{NAME}_2.pt-abcd_123.pt").write_bytes(b"cut short")  # not a checkpoint
    assert resume_path(config_of(*flags, "--load_model_path", first)) == first
    shutil.copy(first, tmp_path / f"{NAME}_1.pt")
    assert resume_path(config_of(*flags, "--load_model_path", first)) == str(tmp_path)


def test_a_damaged_newest_checkpoint_is_skipped_with_a_warning(runs, tmp_path):
    """The newest checkpoint truncated and a killed writer's temporary file beside it: the run
    continues from the newest readable one, says so, and replaces the damaged file."""
    database, _, restarted, _ = runs
    for name in (f"{NAME}_1.pt", f"{NAME}_1_step2.pt", f"{NAME}_2.pt"):
        shutil.copy(restarted / name, tmp_path / name)
    with open(tmp_path / f"{NAME}_2.pt", "r+b") as damaged:
        damaged.truncate(1000)
    temporary = tmp_path / f".tmp-{NAME}_2_step1.pt-abcd_123.pt"
    temporary.write_bytes(b"cut short")
    done = run_trainer(
        *("--train_data", database, "--log_dir", str(tmp_path), "--auto_resume"),
        *("--num_gpus", "2", "--num_epochs", "2", "--keep_checkpoints", "10"),
    )
    assert done.returncode == 0, done.stderr
    assert (
        f"Checkpoint {tmp_path / NAME}_2.pt is not a readable checkpoint" in done.stderr
        and f"resuming from {tmp_path / NAME}_1_step2.pt instead" in done.stderr
    )
    assert not temporary.exists()
    assert checkpoint_files.load_checkpoint(str(tmp_path), NAME)["epoch"] == 2


@pytest.mark.parametrize(
    "flags, refusal",
    [
        (["--seed", "1"], "made with --seed 0, and this run has --seed 1"),
        (["--base_learning_rate", "0.2"], "made with --base_learning_rate 0.1, and this run"),
        (["--num_layers", "34"], "was made with --num_layers 18, this run has 34"),
    ],
)
def test_another_runs_checkpoints_are_refused(runs, tmp_path, capsys, flags, refusal):
    """Checkpoints of other settings under this run's names are another run's: one line, and
    nothing in the directory is touched."""
    database, _, restarted, _ = runs
    shutil.copy(restarted / f"{NAME}_1.pt", tmp_path / f"{NAME}_1.pt")
    before = files(tmp_path)
    line = refused_in_process(
        capsys, "--train_data", database, "--log_dir", str(tmp_path), "--auto_resume", *flags
    )
    assert refusal in line, line
    assert files(tmp_path) == before


def test_checkpoints_of_two_lineages_are_refused(runs, tmp_path, capsys):
    database, _, restarted, _ = runs
    shutil.copy(restarted / f"{NAME}_1.pt", tmp_path / f"{NAME}_1.pt")
    theirs = torch.load(restarted / f"{NAME}_0_step3.pt", weights_only=True)
    theirs["lineage"] = schema.new_lineage()
    checkpoint_files.save_checkpoint(theirs, str(tmp_path / f"{NAME}_0_step3.pt"))
    line = refused_in_process(
        capsys, "--train_data", database, "--log_dir", str(tmp_path), "--auto_resume"
    )
    assert (
        f"of another run than {tmp_path / NAME}_1.pt's (newest: {tmp_path / NAME}_0_step3.pt)"
        in line
    )


def test_auto_resume_with_test_only_is_refused(capsys, tmp_path):
    line = refused_in_process(
        capsys,
        *("--train_data", "null", "--test_only", "--auto_resume", "--test_data", str(tmp_path)),
        *("--load_model_path", str(tmp_path)),
    )
    assert "--auto_resume continues a training run and --test_only trains nothing" in line


def test_a_crafted_setting_is_another_runs(runs, tmp_path, capsys):
    """A checkpoint's settings hold plain values; a tensor where a number belongs compares to
    nothing (no traceback), so the checkpoint is another run's."""
    database, _, restarted, _ = runs
    state = torch.load(restarted / f"{NAME}_1.pt", weights_only=True)
    state["arguments"]["seed"] = torch.tensor([0, 0])
    checkpoint_files.save_checkpoint(state, str(tmp_path / f"{NAME}_1.pt"))
    line = refused_in_process(
        capsys, "--train_data", database, "--log_dir", str(tmp_path), "--auto_resume"
    )
    assert "made with --seed tensor([0, 0]), and this run has --seed 0" in line, line
