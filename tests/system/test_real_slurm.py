"""examples/slurm/train.sbatch under a real Slurm (tests/support/slurm_cluster.py: munged,
slurmctld and slurmd of this machine), on the CPU, 1 node x 2 tasks: a job trains to its end; a
second job of the same run is told to stop mid-run (scancel --signal=USR1, as `sbatch
--signal=USR1@N` and a preemption warn), saves its position, requeues itself, and finishes from
there with the same parameters as the uninterrupted job, bit for bit."""

from __future__ import annotations

import os
import re
import shlex
import stat
import sys
import time

import pytest

from tests.support.slurm_cluster import SlurmCluster, unavailable
from tests.support.trainer_runs import HOOKS, REPOSITORY, SMALL_RUN

pytestmark = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
SBATCH = os.path.join(REPOSITORY, "examples", "slurm", "train.sbatch")
JOB_LIMIT_S = 300
DIGEST = re.compile(r"Parameters identical on all 2 processes \(sha256 ([0-9a-f]{64})\)")
# 4 epochs of 8 steps, a checkpoint every 2: where a stop lands, there is run left after it.
RUN = (
    *("--num_epochs", "4", "--epoch_size", "64", "--warmup_epochs", "0"),
    *("--checkpoint_every_iters", "2", "--keep_checkpoints", "100"),
)
# The job's size on this machine: the example's 2 nodes x 8 GPUs, as 1 node x 2 CPU tasks.
ON_THIS_MACHINE = ("--nodes=1", "--ntasks-per-node=2", "--gpus-per-node=0", "--cpus-per-task=1")


@pytest.fixture(scope="module")
def cluster(module_tmp_path):
    try:
        with SlurmCluster(module_tmp_path / "slurm") as started:
            yield started
    except RuntimeError as failed:  # a daemon that cannot start here
        pytest.skip(f"no Slurm cluster on this machine: {failed}")


@pytest.fixture(scope="module")
def databases(module_tmp_path):
    from tests.support.dbfactory import write_image_db

    return tuple(write_image_db(str(module_tmp_path / name), 64, 4) for name in ("train", "test"))


def submit(
    cluster, directory, databases, *flags: str, hooks: tuple[str, ...] = (), **env: str
) -> str:
    """The example script submitted as it is, sized for this machine; its job id."""
    directory.mkdir()
    bin_directory = directory / "bin"
    bin_directory.mkdir()
    command = bin_directory / "resnet50-trainer"  # this checkout's trainer, as the script calls it
    command.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m resnet50_trainer "$@"\n')
    command.chmod(command.stat().st_mode | stat.S_IXUSR)
    job = cluster.run(
        "sbatch",
        "--parsable",
        *ON_THIS_MACHINE,
        f"--output={directory}/job-%j.out",
        f"--chdir={directory}",
        SBATCH,
        *SMALL_RUN,
        *RUN,
        *flags,
        PATH=os.pathsep.join([str(bin_directory), os.environ["PATH"]]),
        PYTHONPATH=os.pathsep.join([REPOSITORY, *hooks]),
        TRAIN_DATA=databases[0],
        TEST_DATA=databases[1],
        RUN_DIR=str(directory / "run"),
        **env,
    )
    return job.stdout.strip().split(";")[0]


def job_field(cluster, job: str, field: str) -> str:
    shown = cluster.run("scontrol", "show", "job", "-o", job).stdout
    match = re.search(rf"\b{field}=(\S+)", shown)
    assert match, shown
    return match.group(1)


# Slurm holds a requeued job back (BeginTime) so that its previous run's credential, which slurmd
# revoked, has expired when it starts again; the revocation is kept to the second, and a launch in
# the same second is refused for good ("Job credential revoked", the job FAILED). The test shortens
# the hold to this, not to nothing.
REQUEUE_HOLD_S = 3.0


def wait_for_end(cluster, job: str) -> str:
    """The job's final state; a requeued job is let start again REQUEUE_HOLD_S after it was held
    (Slurm's own hold is longer)."""
    deadline = time.monotonic() + JOB_LIMIT_S
    held_since = None
    while time.monotonic() < deadline:
        state = job_field(cluster, job, "JobState")
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return state
        if state == "PENDING" and job_field(cluster, job, "Reason") == "BeginTime":
            held_since = held_since or time.monotonic()
            if time.monotonic() - held_since >= REQUEUE_HOLD_S:
                cluster.run("scontrol", "update", f"JobId={job}", "StartTime=now")
        time.sleep(1)
    cluster.run("scancel", job, check=False)
    pytest.fail(f"job {job} still running after {JOB_LIMIT_S} s:\n{cluster.log()}")


def writing_a_checkpoint(run_directory) -> bool:
    return run_directory.exists() and any(n.startswith(".tmp-") for n in os.listdir(run_directory))


def output_of(directory, job: str) -> str:
    return (directory / f"job-{job}.out").read_text()


@pytest.fixture(scope="module")
def uninterrupted(cluster, databases, module_tmp_path):
    directory = module_tmp_path / "uninterrupted"
    job = submit(cluster, directory, databases)
    state = wait_for_end(cluster, job)
    return job, state, output_of(directory, job)


def test_the_example_job_trains_under_slurm(cluster, uninterrupted):
    job, state, output = uninterrupted
    assert state == "COMPLETED", output[-3000:] + cluster.log()
    assert job_field(cluster, job, "ExitCode") == "0:0"
    assert "2 processes x 4 images = global batch 8" in output
    assert len(DIGEST.findall(output)) == 1, output[-3000:]


def test_a_job_told_to_stop_saves_requeues_and_ends_as_the_uninterrupted_one(
    cluster, databases, uninterrupted, tmp_path
):
    directory = tmp_path / "stopped"
    # Each checkpoint's writer pauses before its rename: the stop arrives while the first is
    # written, so it lands at a known point of the run, early.
    job = submit(
        cluster,
        directory,
        databases,
        hooks=(HOOKS,),
        RESNET50_TRAINER_TEST_PAUSE_BEFORE_RENAME="2",
    )
    run_directory = directory / "run"
    deadline = time.monotonic() + JOB_LIMIT_S
    while not (
        run_directory.exists() and any(n.startswith(".tmp-") for n in os.listdir(run_directory))
    ):
        assert time.monotonic() < deadline, output_of(directory, job)[-3000:]
        time.sleep(0.2)
    cluster.run("scancel", "--signal=USR1", job)
    state = wait_for_end(cluster, job)
    output = output_of(directory, job)
    assert state == "COMPLETED", output[-3000:] + cluster.log()
    assert job_field(cluster, job, "Restarts") == "1", output[-3000:]
    assert "requeued" in output and "Resumed from" in output, output[-3000:]
    (digest,) = DIGEST.findall(output)
    assert [digest] == DIGEST.findall(uninterrupted[2])
