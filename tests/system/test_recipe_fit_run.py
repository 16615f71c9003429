"""--recipe modern on a 2-epoch run: refused before its warm-up was fitted (5 epochs), it now
trains, says what it fitted, and scores its EMA."""

from __future__ import annotations

from tests.support.trainer_runs import run_trainer


def test_modern_runs_a_two_epoch_run(image_db, tmp_path):
    train = image_db("train", 32, 4)
    done = run_trainer(
        *("--train_data", train, "--test_data", train, "--recipe", "modern"),
        *("--num_epochs", "2", "--log_dir", str(tmp_path)),
    )
    assert done.returncode == 0, done.stderr
    assert "--warmup_epochs 0.2 --ema_decay 0.5 --ema_steps 1, fitted to 2 epochs" in done.stderr
    assert "Epoch 2:" in done.stderr and "EMA test accuracy" in done.stderr
