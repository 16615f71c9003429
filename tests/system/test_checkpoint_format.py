"""The on-disk checkpoint format does not change unnoticed: a checkpoint written now holds the
keys, types, dtypes and shapes one written before the package moved into folders held
(tests/support/checkpoint_format.json, pinned from a run of 27c2c92 with the flags below), so
checkpoints written before still resume. It may gain fields a checkpoint may lack (the schema's
optional ones: read_order since), and the run's settings ('arguments') may gain flags; it never
loses either."""

from __future__ import annotations

import os
from dataclasses import fields

import torch

from resnet50_trainer.checkpoint.schema import CheckpointFields
from tests.support.checkpoint_format import pinned, signature
from tests.support.trainer_runs import run_trainer

# The pinned checkpoint's run: a mid-epoch checkpoint (the epoch's sums) with an EMA.
PINNED_RUN = (
    "--train_data", "null", "--epoch_size", "32", "--num_epochs", "1",
    "--checkpoint_every_iters", "2", "--ema_decay", "0.9", "--keep_checkpoints", "10",
)  # fmt: skip


def test_a_checkpoint_holds_what_one_written_before_the_move_held(tmp_path):
    finished = run_trainer(*PINNED_RUN, "--log_dir", str(tmp_path))
    assert finished.returncode == 0, finished.stderr
    state = torch.load(
        os.path.join(tmp_path, "resnet50_model_0_step2.pt"), map_location="cpu", weights_only=True
    )
    now, before = signature(state), pinned()
    assert isinstance(now, dict)
    arguments_now, arguments_before = now.pop("'arguments'"), before.pop("'arguments'")
    assert {key: now[key] for key in before} == before
    # A field added since is one a checkpoint may lack: those written before still resume.
    optional = {
        repr(field.name) for field in fields(CheckpointFields) if field.metadata["optional"]
    }
    assert now.keys() - before.keys() <= optional
    assert {key: arguments_now[key] for key in arguments_before} == arguments_before
