"""A training label past preflight's scan (its time budget at 0 s) stops training as the input
processes read the record: one line naming the label, the record and --num_labels with the
--num_labels that fits, exit 2, never counted as an unreadable record."""

from __future__ import annotations

from tests.support.trainer_runs import HOOKS, REPOSITORY, run_trainer

FIX_FOR_TEN = "outside 0..3 of --num_labels 4: this DB has labels up to 9: --num_labels 10"


def test_a_label_past_preflights_scan_stops_training_with_the_same_line(image_db, tmp_path):
    """Preflight's budget at 0 s: training's input process meets the label."""
    train = image_db("train", 16, 10)
    done = run_trainer(
        *("--train_data", train, "--num_workers", "1"),
        *("--num_epochs", "1", "--log_dir", str(tmp_path)),
        PYTHONPATH=f"{REPOSITORY}:{HOOKS}",
        RESNET50_TRAINER_TEST_LABEL_SCAN_S="0",
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "Training labels: those of the first 0 records checked" in done.stderr
    assert f"--train_data {train} holds label " in errors[0] and FIX_FOR_TEN in errors[0]
    assert "could not be read" not in done.stderr and "undecodable" not in done.stderr
