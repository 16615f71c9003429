"""One line per refusal, and none left behind (issue 24): a launcher's single rank with no
MASTER_ADDR and no job id trains (one rank meets nobody); several such ranks are told in one line
what to give; a refused --solver or --recipe prints no start line before its refusal; the
checkpoint lock file goes with the run that took it, whatever ends it. Real commands."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.dbfactory import write_image_db
from tests.support.trainer_runs import (
    REPOSITORY,
    RUN_TIMEOUT_S,
    refused_in_process,
    run_trainer,
    trainer_command,
)

# Launcher variables a user's environment may carry in: each test sets its own.
_LAUNCHER_PREFIXES = ("PMI_", "MPI_", "OMPI_", "PMIX_", "SLURM_", "MASTER_", "RANK", "WORLD_SIZE")
LOCK = ".resnet50_model.lock"

ONE_RANK = {
    "mpiexec": {"PMI_RANK": "0", "PMI_SIZE": "1", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"},
    "mpirun": {
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "1",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
    },
    "srun": {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_LOCALID": "0",
        "SLURM_STEP_TASKS_PER_NODE": "1",
    },
}


def launched_run(launcher_environment: dict, *args: str):
    """A run as the launcher's rank (no MASTER_ADDR, no job id), whatever this shell holds."""
    environment = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(_LAUNCHER_PREFIXES) and name != "OMPI_MCA_orte_ess_jobid"
    }
    environment.update(launcher_environment, PYTHONPATH=REPOSITORY)
    return subprocess.run(
        trainer_command(*args),
        env=environment,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def database(module_tmp_path):
    return write_image_db(str(module_tmp_path / "train"), 16, 4)


@pytest.mark.parametrize("launcher", ONE_RANK)
def test_a_launcher_s_single_rank_without_master_or_job_id_trains(database, tmp_path, launcher):
    done = launched_run(
        ONE_RANK[launcher],
        *("--train_data", database, "--num_epochs", "1", "--epoch_size", "8"),
        *("--log_dir", str(tmp_path)),
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert (tmp_path / "resnet50_model_1.pt").exists()
    assert not (tmp_path / LOCK).exists()  # the run that took it removed it


def test_ranks_without_master_or_job_id_are_told_what_to_give_in_one_line(database, tmp_path):
    two_ranks = {**ONE_RANK["mpiexec"], "PMI_SIZE": "2", "MPI_LOCALNRANKS": "2"}
    refused = launched_run(two_ranks, "--train_data", database, "--log_dir", str(tmp_path / "out"))
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.splitlines() == [
        "resnet50-trainer: error: mpiexec without MASTER_ADDR needs --run_id: give every "
        "machine the same new id, e.g. --run_id $(uuidgen), or set MASTER_ADDR and MASTER_PORT "
        "(rank 0's machine and a free port there)"
    ]
    assert not (tmp_path / "out").exists()


# A solver the translation accepts, whose settings are then refused: Nesterov without momentum.
REFUSED_SOLVER = 'base_lr: 0.1 momentum: 0 max_iter: 4 test_interval: 2 type: "Nesterov"'


@pytest.mark.parametrize(
    "flags, reason",
    [
        (
            ("--recipe", "modern", "--num_epochs", "3", "--warmup_epochs", "5"),
            "--warmup_epochs 5 leaves",
        ),
        (("--recipe", "modern", "--num_epochs", "9", "--train_data", "/nonexistent"), "exist"),
        (("--solver", "SOLVER"), "--optimizer nesterov needs momentum"),
        (("--solver", "SOLVER", "--train_data", "/nonexistent"), "exist"),
    ],
)
def test_a_refused_recipe_or_solver_is_one_line_with_no_translation_before_it(
    database, tmp_path, flags, reason
):
    solver = tmp_path / "solver.prototxt"
    solver.write_text(REFUSED_SOLVER)
    given = [str(solver) if flag == "SOLVER" else flag for flag in flags]
    if "momentum" not in reason:  # the file accepted: give it momentum
        solver.write_text(REFUSED_SOLVER.replace("momentum: 0", "momentum: 0.9"))
    refused = run_trainer(*("--train_data", database, "--log_dir", str(tmp_path / "out")), *given)
    assert refused.returncode == 2, refused.stderr
    (line,) = refused.stderr.splitlines()
    assert line.startswith("resnet50-trainer: error: ") and reason in line, line


def test_the_translation_is_printed_once_the_run_is_accepted(database, tmp_path):
    solver = tmp_path / "solver.prototxt"
    solver.write_text(REFUSED_SOLVER.replace("momentum: 0", "momentum: 0.9"))
    done = run_trainer(
        *("--train_data", database, "--log_dir", str(tmp_path), "--solver", str(solver)),
        *("--batch_size", "4"),
    )
    assert done.returncode == 0, done.stderr
    assert f"--solver {solver}: type -> --optimizer nesterov" in done.stderr


def test_a_refusal_after_the_lock_was_taken_leaves_no_lock_file(capsys, database, tmp_path):
    """Another run's checkpoint in the directory: refused once this run holds the lock."""
    (tmp_path / "resnet50_model_1.pt").write_bytes(b"another run's")
    line = refused_in_process(capsys, "--train_data", database, "--log_dir", str(tmp_path))
    assert "holds checkpoints of another run" in line, line
    assert sorted(os.listdir(tmp_path)) == ["resnet50_model_1.pt"]
