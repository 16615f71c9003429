"""Checkpoints belong to a run, and a resume picks what can be read: another run's checkpoints,
a second live run on the same names, a killed run's lock, names that cannot be written,
truncated and crafted checkpoints, diverged weights and a directory that turns read-only - all
done for real, on CPU with ResNet-18 at 32 px."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from resnet50_trainer.checkpoint import files as checkpoint_files
from resnet50_trainer.checkpoint import ownership, schema
from resnet50_trainer.checkpoint.lock import lock_checkpoints
from resnet50_trainer.checkpoint.run_state import RunState
from resnet50_trainer.checkpoint.saver import CheckpointSaver
from resnet50_trainer.distributed import process_group
from resnet50_trainer.errors import Diverged, UserError
from resnet50_trainer.model.lr_schedule import LearningRateSchedule
from resnet50_trainer.model.replica import Learner, build_replica
from tests.support.dbfactory import write_image_db
from tests.support.trainer_runs import (
    SMALL_RUN,
    config_of,
    files,
    one_error_line,
    pause_before_rename,
    process_stat,
    refused_in_process,
    run_trainer,
    start_long_run,
    start_trainer,
    wait_for,
)

NAME = "resnet50_model"


@pytest.fixture(scope="module")
def earlier(module_tmp_path):
    """(database, directory) of a finished run of 1 epoch (4 steps): its checkpoints
    resnet50_model_0_step3.pt and resnet50_model_1.pt."""
    root = module_tmp_path
    database = write_image_db(str(root / "db"), 32, 4)
    out = root / "earlier"
    done = run_trainer(
        *("--train_data", database, "--num_epochs", "1", "--log_dir", str(out)),
        *("--checkpoint_every_iters", "3", "--keep_checkpoints", "10"),
    )
    assert done.returncode == 0, done.stderr
    return database, out


def copy_checkpoints(source, destination, *names: str) -> None:
    destination.mkdir(exist_ok=True)
    for name in names:
        shutil.copy(source / name, destination / name)


def rewrite(path, **changes) -> None:
    """The checkpoint at `path` with some fields changed, written as the trainer writes."""
    state = torch.load(path, weights_only=True)
    state.update(changes)
    checkpoint_files.save_checkpoint(state, str(path))


def test_a_fresh_run_refuses_a_directory_holding_another_runs_checkpoint(capsys, earlier, tmp_path):
    database, out = earlier
    copy_checkpoints(out, tmp_path, f"{NAME}_1.pt")
    before = (tmp_path / f"{NAME}_1.pt").read_bytes()
    line = refused_in_process(capsys, "--train_data", database, "--log_dir", str(tmp_path))
    assert f"holds checkpoints of another run (newest: {tmp_path / NAME}_1.pt)" in line
    assert f"--load_model_path {tmp_path}" in line and "--save_model_name" in line
    assert (tmp_path / f"{NAME}_1.pt").read_bytes() == before
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".log")]


def test_a_resume_refuses_a_directory_holding_checkpoints_of_another_lineage(
    capsys, earlier, tmp_path
):
    database, out = earlier
    copy_checkpoints(out, tmp_path, f"{NAME}_0_step3.pt", f"{NAME}_1.pt")
    rewrite(tmp_path / f"{NAME}_1.pt", lineage="another run")
    before = files(tmp_path)
    line = refused_in_process(
        capsys,
        *("--train_data", database, "--log_dir", str(tmp_path)),
        *("--load_model_path", str(tmp_path / f"{NAME}_0_step3.pt")),
    )
    assert (
        f"of another run than {tmp_path / NAME}_0_step3.pt's (newest: {tmp_path / NAME}_1.pt)"
        in line
    )
    assert {name: files(tmp_path)[name] for name in before} == before


def test_retention_deletes_only_this_lineages_checkpoints(earlier, tmp_path):
    _, out = earlier
    state = torch.load(out / f"{NAME}_1.pt", weights_only=True)
    for epoch, lineage in ((1, "ours"), (2, "theirs"), (3, "ours"), (4, "ours")):
        checkpoint_files.save_checkpoint(
            {**state, "lineage": lineage},
            checkpoint_files.checkpoint_path(str(tmp_path), NAME, epoch),
        )
    (tmp_path / f"{NAME}_0.pt").write_bytes(b"unreadable: never deleted")
    del state["lineage"]  # written before lineages: another run's, unless resumed from
    checkpoint_files.save_checkpoint(
        state, checkpoint_files.checkpoint_path(str(tmp_path), NAME, 5)
    )
    # The one just written (3) counts as the newest, though 4 (of a run resumed from 3) is later.
    ownership.remove_older(str(tmp_path), NAME, 1, "ours", str(tmp_path / f"{NAME}_3.pt"))
    assert sorted(os.listdir(tmp_path)) == [f"{NAME}_{n}.pt" for n in (0, 2, 3, 5)]
    ownership.remove_older(str(tmp_path), NAME, 1, "", str(tmp_path / f"{NAME}_6.pt"))
    assert sorted(os.listdir(tmp_path)) == [f"{NAME}_{n}.pt" for n in (0, 2, 3)]


def test_a_second_run_on_the_same_names_refuses_and_the_first_finishes(capsys, earlier, tmp_path):
    """The first run is stopped (SIGSTOP) while it writes a checkpoint, so the second starts
    while the first is certainly alive and mid-write; nothing of the first's is touched."""
    database, _ = earlier
    first = start_trainer(
        *("--train_data", database, "--num_epochs", "2", "--log_dir", str(tmp_path)),
        **pause_before_rename(2),
    )
    try:
        wait_for(
            lambda: any(name.startswith(f".tmp-{NAME}_1.pt-") for name in os.listdir(tmp_path)),
            180,
            "the first run's checkpoint write",
        )
        os.killpg(first.pid, signal.SIGSTOP)
        # Signals are not instant: T is the stopped state.
        wait_for(lambda: process_stat(first.pid)[0] == "T", 30, "the first run to stop")
        writing = files(tmp_path)
        line = refused_in_process(capsys, "--train_data", database, "--log_dir", str(tmp_path))
        assert files(tmp_path) == writing
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    _, stderr = first.communicate(timeout=240)
    assert first.returncode == 0, stderr
    assert f"another run is writing checkpoints {NAME}_*.pt in {tmp_path}" in line
    assert f"{tmp_path}/.{NAME}.lock" in line
    assert checkpoint_files.load_checkpoint(str(tmp_path), NAME)["path"] == str(
        tmp_path / f"{NAME}_2.pt"
    )


def lock_is_free(path) -> bool:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(descriptor)


def test_a_killed_run_leaves_no_stuck_lock_and_its_temporary_files_go(earlier, tmp_path):
    """The run is killed, not its input processes: they outlive it a while, without its lock."""
    database, _ = earlier
    run = start_long_run(database, tmp_path, "--num_workers", "2")
    try:
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
        assert lock_is_free(tmp_path / f".{NAME}.lock")
    finally:
        with contextlib.suppress(ProcessLookupError):  # the input processes may be gone already
            os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
    ours = tmp_path / f".tmp-{NAME}_2.pt-k1lled_9.pt"  # as a writer killed mid-write leaves it
    theirs = tmp_path / f".tmp-{NAME}_x_2.pt-abcdefgh.pt"  # of a run named resnet50_model_x
    for path in (ours, theirs):
        path.write_bytes(b"partial")
    done = run_trainer(
        *("--train_data", database, "--num_epochs", "2"),
        *("--log_dir", str(tmp_path), "--load_model_path", str(tmp_path)),
    )
    assert done.returncode == 0, done.stderr
    assert not ours.exists() and theirs.read_bytes() == b"partial"
    assert [s.epoch for s in checkpoint_files.saved_checkpoints(str(tmp_path), NAME)] == [2]


@pytest.mark.parametrize(
    "name, problem",
    [
        ("a/b", "has a directory part"),
        ("../up", "has a directory part"),
        ("", "is empty"),
        (".tmp-x", "starts with .tmp-"),
        ("n" * 300, "(File name too long): choose a shorter name"),
        (".", "starts with '.'"),
        ("..", "starts with '.'"),
        ("a\nb", "holds a control character"),
    ],
)
def test_a_checkpoint_name_that_cannot_be_written_is_refused_at_start(
    capsys, earlier, tmp_path, name, problem
):
    database, _ = earlier
    line = refused_in_process(
        capsys, "--train_data", database, "--log_dir", str(tmp_path), "--save_model_name", name
    )
    assert "--save_model_name" in line and problem in line
    assert os.listdir(tmp_path) == []


def test_a_directory_resumes_from_its_newest_readable_checkpoint(earlier, tmp_path, caplog):
    _, out = earlier
    copy_checkpoints(out, tmp_path, f"{NAME}_0_step3.pt", f"{NAME}_1.pt")
    newest = tmp_path / f"{NAME}_1.pt"
    newest.write_bytes(newest.read_bytes()[:1_000_000])  # cut short, as by a full disk copy
    with caplog.at_level(logging.WARNING):
        state = checkpoint_files.load_checkpoint(str(tmp_path), NAME)
    assert state["path"] == str(tmp_path / f"{NAME}_0_step3.pt")
    assert (
        f"Checkpoint {newest} is not a readable checkpoint" in caplog.text
        and f"resuming from {tmp_path / NAME}_0_step3.pt instead" in caplog.text
    ), caplog.text
    (tmp_path / f"{NAME}_0_step3.pt").write_bytes(b"")
    with pytest.raises(
        UserError,
        match=f"none of its 2 checkpoints can be resumed "
        f"\\(the newest, {newest}, is not a readable",
    ):
        checkpoint_files.load_checkpoint(str(tmp_path), NAME)


def crafted(state: dict) -> list[tuple[str, dict, str]]:
    model, optimizer = state["model"], state["optimizer"]
    momentum = {**optimizer["state"], 0: {"momentum_buffer": torch.zeros(3)}}
    return [
        ("epoch a string", {"epoch": "3"}, "has field epoch of type str"),
        ("negative step", {"step": -1}, "has field step = -1"),
        ("model not tensors", {"model": {**model, "fc.bias": [0.0]}}, "a model state that is not"),
        (
            "sums of 3",
            {"step": 2, "epoch_sums": torch.ones(3, dtype=torch.float64)},
            "epoch_sums of shape (3,), not (4,)",
        ),
        (
            "fc of 5 classes",
            {"model": {**model, "fc.bias": torch.zeros(5)}},
            "model tensor fc.bias of shape (5,), this model's is (4,)",
        ),
        ("a key too many", {"model": {**model, "extra": torch.zeros(1)}}, "extra unknown to"),
        (
            "momentum of another shape",
            {"optimizer": {**optimizer, "state": momentum}},
            "optimizer state (entry 0) that fits no parameter",
        ),
        ("a lineage crafted empty", {"lineage": ""}, "a lineage '' that new_lineage() never makes"),
        (
            "an epoch's end far into an epoch",
            {"step": 10**9},
            "step 1000000000 without the epoch's sums",
        ),
        (
            "weights of nan",
            {"model": {**model, "fc.bias": torch.full((4,), float("nan"))}},
            "non-finite values in fc.bias",
        ),
        (
            "sums of nan",
            {"step": 2, "epoch_sums": torch.tensor([float("nan"), 1, 8, 0], dtype=torch.float64)},
            "epoch_sums [nan, 1.0, 8.0, 0.0] that no epoch adds up to",
        ),
        (
            "sums below zero",
            {"step": 2, "epoch_sums": torch.tensor([1, -27, -96, 0], dtype=torch.float64)},
            "epoch_sums [1.0, -27.0, -96.0, 0.0] that no epoch adds up to",
        ),
        (
            "runs of no records",
            {"read_order": {"run_length": 0, "window_runs": 1024}},
            "a read order that is not a run length and a window of runs",
        ),
    ]


@pytest.mark.parametrize("case", range(13))
def test_a_crafted_checkpoint_is_one_line(capsys, earlier, tmp_path, case):
    database, out = earlier
    state = torch.load(out / f"{NAME}_1.pt", weights_only=True)
    _, changes, expected = crafted(state)[case]
    path = tmp_path / "crafted_1.pt"
    checkpoint_files.save_checkpoint({**state, **changes}, str(path))
    logs = tmp_path / "logs"
    line = refused_in_process(
        capsys, "--train_data", database, "--log_dir", str(logs), "--load_model_path", str(path)
    )
    assert expected in line and str(path) in line, line


def test_a_mid_epoch_checkpoint_beyond_a_shorter_epoch_warns(earlier, tmp_path):
    """3 steps into epoch 1 of 4 steps, resumed with epochs of 2 steps: epoch 1 ends at once."""
    database, out = earlier
    done = run_trainer(
        *("--train_data", database, "--epoch_size", "16", "--num_epochs", "2"),
        *("--log_dir", str(tmp_path), "--load_model_path", str(out / f"{NAME}_0_step3.pt")),
    )
    assert done.returncode == 0, done.stderr
    assert (
        f"{NAME}_0_step3.pt is 3 steps into epoch 1, but this run's epochs have 2 steps"
        in done.stderr
    ), done.stderr
    assert [s.epoch for s in checkpoint_files.saved_checkpoints(str(tmp_path), NAME)] == [2]


@pytest.fixture
def saver(tmp_path):
    """The checkpoint saver of a ResNet-18 in this process, in a real Gloo group of one."""
    argv = [*SMALL_RUN, "--train_data", "null", "--epoch_size", "8", "--log_dir", str(tmp_path)]
    config = config_of(*argv)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        device = torch.device("cpu")
        learner = Learner(
            process_group.placement_for(config, 0),
            device,
            build_replica(config, 0, device),
            LearningRateSchedule(0.1, 1, 0),
        )
        yield CheckpointSaver(config, learner, schema.new_lineage())
    finally:
        dist.destroy_process_group()


def test_diverged_weights_are_never_saved_over_good_ones(saver, tmp_path):
    run = RunState(epochs_done=1)
    good = saver.save(run)
    before = files(tmp_path)
    model = saver.replica.model
    with torch.no_grad():
        model.layer2[0].bn1.running_var[3] = float("inf")
        model.fc.weight[0, 0] = float("nan")
    run.epochs_done, run.iteration = 2, 9
    with pytest.raises(Diverged) as diverged:
        saver.save(run)
    message = str(diverged.value)
    assert "\n" not in message
    assert (
        "no longer finite at epoch 2, iteration 9 (layer2.0.bn1.running_var and 1 more): "
        f"{NAME}_2.pt was not written" in message
    ), message
    assert files(tmp_path) == before
    assert checkpoint_files.load_checkpoint(good, NAME)["lineage"] == saver.lineage


def test_a_diverged_run_of_two_processes_ends_with_one_line(earlier, tmp_path):
    """An LR of 1e30 makes the weights overflow in epoch 2; epoch 1's checkpoint stays. (Whether
    the loss check of the loop or the save guard stops it, the line is one and the status 1.)"""
    database, out = earlier
    copy_checkpoints(out, tmp_path, f"{NAME}_1.pt")
    before = files(tmp_path)
    done = run_trainer(
        *("--train_data", database, "--num_gpus", "2", "--num_epochs", "2"),
        *("--base_learning_rate", "1e30", "--log_dir", str(tmp_path / "logs")),
        *("--checkpoint_dir", str(tmp_path), "--load_model_path", str(tmp_path)),
    )
    assert done.returncode == 1, done.stderr
    assert "finite" in one_error_line(done.stderr)
    assert {name: files(tmp_path)[name] for name in before} == before
    assert [s.epoch for s in checkpoint_files.saved_checkpoints(str(tmp_path))] == [1]


def test_a_checkpoint_dir_turned_read_only_mid_run_is_one_line(earlier, tmpfs, tmp_path):
    database, _ = earlier
    disk = Path(tmpfs("disk", "400m"))
    run = start_trainer(
        *("--train_data", database, "--num_gpus", "2", "--num_epochs", "1000"),
        *("--log_dir", str(tmp_path / "logs"), "--checkpoint_dir", str(disk)),
    )
    try:
        wait_for(lambda: (disk / f"{NAME}_1.pt").exists(), 180, "the first checkpoint")
        # Refused (busy) while a checkpoint is open for writing: retried until it is not.
        wait_for(
            lambda: (
                subprocess.run(
                    ["mount", "-o", "remount,ro", str(disk)], capture_output=True
                ).returncode
                == 0
            ),
            60,
            "remount ro",
        )
        _, stderr = run.communicate(timeout=240)
    finally:
        run.kill()
        run.communicate()
    assert run.returncode == 2, stderr
    line = one_error_line(stderr)
    assert "writing checkpoint" in line and "failed (Read-only file system)" in line, line
    newest = checkpoint_files.saved_checkpoints(str(disk), NAME)[-1]
    assert checkpoint_files.load_checkpoint(newest.path, NAME)["epoch"] == newest.epoch


def test_a_directory_resumes_this_name_s_checkpoints_not_another_name_s(capsys, earlier, tmp_path):
    """Two names share a directory (the lock is per name): resuming name B from the directory
    takes B's newest, however new A's are."""
    database, out = earlier
    copy_checkpoints(out, tmp_path, f"{NAME}_1.pt")
    shutil.copy(out / f"{NAME}_0_step3.pt", tmp_path / "B_0_step3.pt")
    state = checkpoint_files.load_checkpoint(str(tmp_path), "B")
    assert state["path"] == str(tmp_path / "B_0_step3.pt")
    line = refused_in_process(
        capsys,
        *("--train_data", database, "--log_dir", str(tmp_path / "logs")),
        *("--save_model_name", "C", "--load_model_path", str(tmp_path)),
    )
    assert "without checkpoints named C_<epoch>.pt" in line, line


def test_an_unmarked_checkpoint_resumed_elsewhere_does_not_adopt_that_directory_s_files(
    capsys, earlier, tmp_path
):
    """Checkpoints written before lineages all look alike: one resumed from another directory
    is another run than the unmarked checkpoints already in --checkpoint_dir."""
    database, out = earlier
    state = torch.load(out / f"{NAME}_1.pt", weights_only=True)
    del state["lineage"]
    (tmp_path / "old").mkdir()
    (tmp_path / "here").mkdir()
    checkpoint_files.save_checkpoint(state, str(tmp_path / "old" / f"{NAME}_1.pt"))
    checkpoint_files.save_checkpoint({**state, "epoch": 3}, str(tmp_path / "here" / f"{NAME}_3.pt"))
    before = files(tmp_path / "here")
    line = refused_in_process(
        capsys,
        *("--train_data", database, "--log_dir", str(tmp_path / "here")),
        *("--load_model_path", str(tmp_path / "old" / f"{NAME}_1.pt")),
    )
    assert "holds checkpoints of another run" in line and f"{NAME}_3.pt" in line, line
    assert {name: files(tmp_path / "here")[name] for name in before} == before
    # Resumed in its own directory, the unmarked run continues there.
    assert (
        ownership.lineage_of(
            checkpoint_files.load_checkpoint(str(tmp_path / "here"), NAME), str(tmp_path / "here")
        )
        == ownership.UNMARKED_LINEAGE
    )


def test_a_released_lock_can_be_taken_again_in_the_same_process(tmp_path):
    """A run called twice in one process (tests, notebooks) on one directory: the first run's
    lock ends with it."""
    lock = lock_checkpoints(str(tmp_path), NAME)
    with pytest.raises(UserError, match="another run is writing checkpoints"):
        lock_checkpoints(str(tmp_path), NAME)
    lock.release()
    lock_checkpoints(str(tmp_path), NAME).release()


def test_machines_that_would_resume_different_checkpoints_are_refused(earlier, tmp_path):
    """Two machines with disks of their own: each resumes the file it is given, and they differ.
    The replicas would part silently; the run stops before the first step instead."""
    database, out = earlier
    common = [
        *("--train_data", database, "--num_shards", "2", "--run_id", "differ"),
        *("--file_store_path", str(tmp_path), "--num_epochs", "2"),
    ]
    shards = [
        start_trainer(
            *common,
            *("--shard_id", str(shard), "--log_dir", str(tmp_path / str(shard))),
            *("--load_model_path", str(out / name)),
        )
        for shard, name in ((0, f"{NAME}_1.pt"), (1, f"{NAME}_0_step3.pt"))
    ]
    (status_0, (_, stderr_0)), (status_1, _) = [
        (shard.wait(timeout=240), shard.communicate()) for shard in shards
    ]
    assert status_0 == 2 and status_1 != 0, stderr_0
    line = one_error_line(stderr_0)
    assert (
        "the processes would resume different checkpoints (rank 0: " in line
        and "1 epochs and 0 steps done; rank 1: 0 epochs and 3 steps done)" in line
    ), line
    assert checkpoint_files.saved_checkpoints(str(tmp_path / "0"), NAME) == []
