"""A scheduler's stop signal (SIGTERM, SIGUSR1; SIGHUP, a closed terminal's), for real on CPU: the
run saves its exact position at a step every process agrees on, exits 3 with one line, and
--auto_resume then ends with the weights of an uninterrupted run, bit for bit (the digest the run
prints). The signal is sent at a known optimizer step by tests/support/hooks/sitecustomize.py,
never at a time.

32 records, global batch 8: 4 steps an epoch, 2 epochs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess

import pytest

from resnet50_trainer.errors import PREEMPTED_EXIT_STATUS
from tests.support.dbfactory import caffe_key, datum_record, smooth_pixels, write_db, write_image_db
from tests.support.trainer_runs import (
    HOOKS,
    REPOSITORY,
    RUN_TIMEOUT_S,
    start_trainer,
    trainer_command,
    trainer_env,
    training_processes,
    wait_for,
)

RECORDS = 32
DIGEST = re.compile(r"Parameters identical on all (\d) processes \(sha256 ([0-9a-f]{64})\)")
# Every line a run prints up to its stop; anything else (another library's last words, a
# traceback) fails the test.
OUR_LINES = re.compile(
    r"ResNet-18, \d process(es)? x .*"
    r"|Epoch 2 goes on in the order it began in .*"
    r"|Finished iteration \d+/4 of epoch \d .*"
    r"|Training loss: .*"
    r"|Epoch \d: loss .*"
    r"|A stop signal came: saving the run's position at iteration \d+ in .*; should the save be "
    r"cut short, the last complete checkpoint \(.*\) stays intact"
)


def signalled(steps: int, name: str, index: int, target: str) -> dict:
    return {
        "PYTHONPATH": f"{REPOSITORY}:{HOOKS}",
        "RESNET50_TRAINER_TEST_SIGNAL_AFTER_STEPS": f"{steps}:{name}:{index}:{target}",
    }


def two_epochs(database: str, out, processes: int, *args: str, **env: str):
    """A run in a process group of its own (as a job's), which a signal to the group reaches."""
    return subprocess.run(
        trainer_command(
            *("--train_data", database, "--num_gpus", str(processes), "--num_epochs", "2"),
            *("--log_dir", str(out), "--num_workers", "1", *args),
        ),
        env=trainer_env(**env),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        start_new_session=True,
    )


def digest(done, processes: int) -> str:
    assert done.returncode == 0, done.stderr
    found = DIGEST.search(done.stderr)
    assert found and found.group(1) == str(processes), done.stderr
    return found.group(2)


@pytest.fixture(scope="module")
def database(module_tmp_path):
    return write_image_db(str(module_tmp_path / "db"), RECORDS, 4)


@pytest.fixture(scope="module")
def uninterrupted(database, module_tmp_path):
    """processes -> the final digest of the run in one go; each run once, when first asked."""
    digests: dict[int, str] = {}

    def run(processes: int) -> str:
        if processes not in digests:
            out = module_tmp_path / f"uninterrupted_{processes}"
            digests[processes] = digest(two_epochs(database, out, processes), processes)
        return digests[processes]

    return run


def assert_preempted(done, stop_line: str) -> None:
    """Exit 3; the output is our lines, then the stop's one line, and nothing else."""
    assert done.returncode == PREEMPTED_EXIT_STATUS, done.stderr
    *lines, last = done.stderr.strip().splitlines()
    assert re.fullmatch(stop_line, last), done.stderr
    assert all(OUR_LINES.fullmatch(line) for line in lines), done.stderr
    assert sum(line.startswith("A stop signal came") for line in lines) == 1, done.stderr


@pytest.mark.parametrize(
    "processes, name, target",
    [
        (2, "SIGTERM", "group"),  # a scheduler's stop
        (2, "SIGUSR1", "self"),  # Slurm's --signal=USR1@N, to one process
        (1, "SIGHUP", "group"),  # a closed terminal's, to its foreground job
    ],
)
def test_signal_saves_the_step_and_auto_resume_ends_bitwise_equal(
    database, uninterrupted, tmp_path, processes, name, target
):
    # After step 5 (epoch 2, step 1); every process learns of it at the next check, step 3 of
    # epoch 2 (--print_every 3), and stops there; input processes ignore a signal to the group.
    done = two_epochs(
        database, tmp_path, processes, "--print_every", "3", **signalled(5, name, 0, target)
    )
    saved = tmp_path / "resnet50_model_1_step3.pt"
    assert_preempted(
        done,
        rf"resnet50-trainer: error: stopped by {name} at iteration 7 \(epoch 2, step 3 of 4\), "
        rf"saved in {re.escape(str(saved))}: restart with the same flags and --auto_resume to go "
        "on from there",
    )
    assert saved.exists()
    resumed = two_epochs(database, tmp_path, processes, "--print_every", "3", "--auto_resume")
    assert "iteration 7" in resumed.stderr, resumed.stderr
    assert digest(resumed, processes) == uninterrupted(processes)


def test_signal_to_the_launcher_alone_reaches_every_process(database, uninterrupted, tmp_path):
    # Forwarded by the launcher: the step it lands on depends on when, but wherever the run
    # stopped, its resumption ends where the uninterrupted run did.
    done = two_epochs(
        database, tmp_path, 2, "--print_every", "1", **signalled(2, "SIGTERM", 1, "launcher")
    )
    assert_preempted(
        done,
        r"resnet50-trainer: error: stopped by SIGTERM at iteration \d \(epoch \d, step \d of 4\), "
        r"saved in .*: restart with the same flags and --auto_resume to go on from there",
    )
    resumed = two_epochs(database, tmp_path, 2, "--print_every", "1", "--auto_resume")
    assert digest(resumed, 2) == uninterrupted(2)


def test_a_stop_signal_to_a_training_process_as_it_starts_is_held_then_saved(database, tmp_path):
    """SIGTERM to rank 1 the moment it exists, before it can record one: it waits blocked (the
    launcher starts its processes with the stop signals blocked) and the run saves and stops, as
    for any stop signal. Until starting multiprocessing's resource tracker, which unblocks SIGTERM
    in the launcher, was moved before the block, the signal killed rank 1."""
    run = start_trainer(
        *("--train_data", database, "--num_gpus", "2", "--num_epochs", "2"),
        *("--log_dir", str(tmp_path), "--num_workers", "1"),
    )
    wait_for(lambda: len(training_processes(run.pid)) == 2, RUN_TIMEOUT_S, "2 processes")
    os.kill(training_processes(run.pid)[1], signal.SIGTERM)
    _, stderr = run.communicate(timeout=RUN_TIMEOUT_S)
    assert "killed by SIGTERM" not in stderr, stderr
    assert run.returncode == PREEMPTED_EXIT_STATUS, stderr


SIGTERM_AT_5 = signalled(5, "SIGTERM", 0, "group")


@pytest.fixture(scope="module")
def large_records(module_tmp_path):
    """Raw 160x200 Datum records, ~100 KB each: quasi-random order's runs (512 KB) hold 5."""
    records = [
        (caffe_key(i, f"img{i}"), datum_record(i % 4, pixels=smooth_pixels(160, 200, 3, seed=i)))
        for i in range(RECORDS)
    ]
    return write_db(str(module_tmp_path / "large"), "lmdb", records)


def test_quasi_random_order_resumes_bitwise_equal_and_keeps_its_epoch_s_order(
    large_records, tmp_path
):
    """Stopped mid-epoch by SIGTERM in quasi-random order; resumed once as it was, once asking
    for random order: both finish that epoch in the order it began in and end bitwise equal to
    the uninterrupted run. Windows of 1 MB (2 runs) cut the DB into many; its labels are mixed
    within a run, so the start's check of the label mix passes in silence."""
    quasi = ("--read_order", "quasi_random", "--read_window_mb", "1", "--print_every", "3")
    straight = two_epochs(large_records, tmp_path / "straight", 2, *quasi)
    assert "read order quasi_random, runs of 5 records shuffled in windows of 2 runs" in (
        straight.stderr
    )
    assert "mixes this DB's labels poorly" not in straight.stderr
    stopped = two_epochs(large_records, tmp_path / "quasi_random", 2, *quasi, **SIGTERM_AT_5)
    assert stopped.returncode == PREEMPTED_EXIT_STATUS, stopped.stderr
    shutil.copytree(tmp_path / "quasi_random", tmp_path / "random")
    for resumed_order in ("quasi_random", "random"):
        window = ("--read_window_mb", "1") if resumed_order == "quasi_random" else ()
        again = ("--read_order", resumed_order, *window, "--print_every", "3", "--auto_resume")
        resumed = two_epochs(large_records, tmp_path / resumed_order, 2, *again)
        assert digest(resumed, 2) == digest(straight, 2)
        switched = (
            "Epoch 2 goes on in the order it began in (quasi_random, runs of 5 records shuffled "
            "in windows of 2 runs); the epochs after it read in random" in resumed.stderr
        )
        assert switched == (resumed_order == "random"), resumed.stderr
