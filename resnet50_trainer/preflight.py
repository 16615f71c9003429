"""The run's inputs checked once, in the launching process, before any training process starts and
before any file is written: a bad input ends the run with one line naming the fix (exit 2)."""

from __future__ import annotations

import os
import tempfile

from resnet50_trainer import checkpoint
from resnet50_trainer.config import Config
from resnet50_trainer.data.databases import open_database
from resnet50_trainer.data.records import decode_image, parse_record
from resnet50_trainer.errors import RecordError, UserError

# Records sampled, evenly over the DB, to tell a DB of images from one of something else. A DB
# with a few bad records passes (they are skipped while training); one where all fail does not.
RECORDS_SAMPLED = 16


def check_inputs(config: Config) -> None:
    check_outputs_writable(config)
    if not config.synthetic:
        _check_holds_images(config)
    if config.test_data is not None:
        _check_test_labels(config)
    if config.load_model_path:
        checkpoint.check_matches(checkpoint.load_checkpoint(config.load_model_path), config)


def check_outputs_writable(config: Config) -> None:
    """Fail before any work if the log or checkpoint directory cannot take files."""
    for flag, directory in (("--log_dir", config.log_dir), ("--checkpoint_dir", config.checkpoint_dir)):
        try:
            os.makedirs(directory, exist_ok=True)
            with tempfile.TemporaryFile(dir=directory):
                pass
        except OSError as error:
            raise UserError(f"{flag} {directory} cannot be written ({error.strerror}): "
                            "choose a writable directory") from None


def _check_holds_images(config: Config) -> None:
    with open_database(config.train_data, config.db_type) as database:
        keys = database.keys()
        sampled = keys[::max(1, len(keys) // RECORDS_SAMPLED)][:RECORDS_SAMPLED]
        problems = []
        for key in sampled:
            try:
                decode_image(parse_record(database.get(key)), config.num_channels)
                return
            except RecordError as error:
                problems.append((key, error))
    key, error = problems[0]
    raise UserError(f"--train_data {config.train_data}: none of {len(sampled)} records sampled is "
                    f"an image (e.g. key {key.decode(errors='replace')}: {error}): give a DB of "
                    "Caffe Datum or Caffe2 TensorProtos image records")


def _check_test_labels(config: Config) -> None:
    """Every test label must be a class of the model; the scan parses records but decodes none."""
    with open_database(config.test_data, config.db_type) as database:
        for key in database.keys():
            try:
                label = parse_record(database.get(key)).label
            except RecordError:
                continue  # skipped and not scored during evaluation, like a bad training record
            if not 0 <= label < config.num_labels:
                raise UserError(f"--test_data {config.test_data} holds label {label} (key "
                                f"{key.decode(errors='replace')}), outside 0..{config.num_labels - 1}: "
                                f"set --num_labels to at least {label + 1} or use a test DB of "
                                "this model's classes")
