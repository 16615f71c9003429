"""The run's inputs checked once, in the launching process, before any training process starts and
before any file is written: a bad input ends the run with one line naming the fix (exit 2)."""

from __future__ import annotations

import logging
import os
import tempfile
import time

from resnet50_trainer.checkpoint import files as checkpoint_files
from resnet50_trainer.checkpoint.auto_resume import check_same_run, resume_path
from resnet50_trainer.checkpoint.claim import (
    check_checkpoint,
    check_checkpoint_name,
    claim_checkpoint_names,
)
from resnet50_trainer.checkpoint.initial_weights import read_init_model
from resnet50_trainer.checkpoint.lock import CheckpointLock
from resnet50_trainer.config.settings import Config
from resnet50_trainer.data.formats.databases import open_database
from resnet50_trainer.data.formats.images import decode_image
from resnet50_trainer.data.formats.keys import printable_key
from resnet50_trainer.data.formats.label_scan import LabelScan, scan_labels
from resnet50_trainer.data.formats.records import parse_record
from resnet50_trainer.distributed import grad_compression
from resnet50_trainer.errors import RecordError, UserError
from resnet50_trainer.launch.needs import check_limits
from resnet50_trainer.path_words import denied, shown, unreachable
from resnet50_trainer.train.labels import (
    scan_training_labels,
    test_label_refusal,
    training_label_refusal,
)

log = logging.getLogger(__name__)
# Seconds preflight spends on the test labels: a cold ImageNet DB takes minutes to read, so the
# first test (train/evaluation.py) checks what is left as it reads it.
LABEL_SCAN_S = 5.0
# Seconds it spends on the training labels: training checks every label as it reads the record
# anyway, so this only moves an early refusal before the first write, and each second of it is a
# second before the first step (5 s read 465k records of a 1.28M-record DB: +5.4 s to the start).
TRAINING_LABEL_SCAN_S = 1.0
# Records sampled, evenly over the DB, to tell a DB of images from one of something else. A DB
# with a few bad records passes (they are skipped while training); one where all fail does not.
RECORDS_SAMPLED = 16


def check_inputs(config: Config, writes_checkpoints: bool = True) -> CheckpointLock | None:
    """`writes_checkpoints`: this process runs (or launches) global rank 0, which writes the
    checkpoints (and alone reads --init_model); it then takes the checkpoints' lock, returned for
    the caller to hold until the run ends. A --test_only run reads no training DB and writes
    nothing: it needs no writable directory and takes no lock."""
    check_checkpoint_name(config.save_model_name)
    grad_compression.check_supported(config)
    check_limits(config)
    if not config.test_only and not config.synthetic:
        _check_holds_images(config)
        _check_training_labels(config, TRAINING_LABEL_SCAN_S)
    if config.test_data is not None:
        _check_test_labels(config, config.test_data, LABEL_SCAN_S)
    resumed = None
    source = resume_path(config)
    if source:
        resumed = checkpoint_files.load_checkpoint(source, config.save_model_name, warn=False)
        check_checkpoint(resumed, config)
        check_same_run(resumed, config)
    if config.init_model and writes_checkpoints:
        read_init_model(config.init_model, config, say=False)
    if not config.test_only:
        check_outputs_writable(config)  # after the other checks: a refusal leaves no folder
    if config.test_only or not writes_checkpoints:
        return None
    return claim_checkpoint_names(config, resumed)


def check_outputs_writable(config: Config) -> None:
    """Make the log and checkpoint directories; UserError if either cannot take files."""
    for flag, directory in (
        ("--log_dir", config.log_dir),
        ("--checkpoint_dir", config.checkpoint_dir),
    ):
        try:
            os.makedirs(directory, exist_ok=True)
            with tempfile.TemporaryFile(dir=directory):
                pass
        except OSError as error:
            raise UserError(
                f"{flag} {shown(directory)} cannot be written{_why_not(directory, error)}"
            ) from None


def _why_not(directory: str, error: OSError) -> str:
    """Why `directory` cannot be made or take a file, and the fix."""
    refused = unreachable(directory)
    if refused is None and isinstance(error, PermissionError):
        existing = directory
        while not os.path.exists(existing):
            existing = os.path.dirname(os.path.abspath(existing))
        refused = denied("write in", existing)
    if refused:
        return f": {refused}"
    # makedirs says "File exists" where a file stands in the directory's place.
    reason = "a file, not a directory" if os.path.isfile(directory) else error.strerror
    return f" ({reason}): choose a writable directory"


def _check_holds_images(config: Config) -> None:
    with open_database(config.train_data, config.db_type) as database:
        keys = database.keys()
        sampled = keys[:: max(1, len(keys) // RECORDS_SAMPLED)][:RECORDS_SAMPLED]
        problems = []
        for key in sampled:
            try:
                decode_image(parse_record(database.get(key)), config.num_channels)
                return
            except RecordError as error:
                problems.append((key, error))
    key, first_error = problems[0]
    raise UserError(
        f"--train_data {shown(config.train_data)}: none of {len(sampled)} records sampled is "
        f"an image (e.g. key {printable_key(key)}: {first_error}): "
        "give a DB of Caffe Datum or Caffe2 TensorProtos image records"
    )


def _check_test_labels(config: Config, test_data: str, budget_s: float) -> None:
    """Every test label the test reads (--test_epoch_size) must be a class of the model: checked
    here for `budget_s` seconds (label_scan.scan_labels: the wire format, no image decoded), and
    by the first test for what is left."""
    started = time.monotonic()
    with open_database(test_data, config.db_type) as database:
        scan = scan_labels(database.items(), config.num_labels, budget_s, config.test_epoch_size)
    if scan.outside is not None:
        key, label = scan.outside
        raise test_label_refusal(f"--test_data {shown(test_data)}", label, config.num_labels, key)
    _say_if_partial(scan, started, "Test labels", "the first test checks")


def _check_training_labels(config: Config, budget_s: float) -> None:
    """Every training label must be a class of the model: checked here for `budget_s` seconds as
    the test labels are, and by training for what is left as it reads each record."""
    started = time.monotonic()
    scan = scan_training_labels(config, budget_s)
    if scan.outside is not None:
        raise training_label_refusal(config, *scan.outside, scan)
    _say_if_partial(scan, started, "Training labels", "training checks")


def _say_if_partial(scan: LabelScan, started: float, labels: str, checked_later_by: str) -> None:
    """A scan that its time ran out for says how far it got and who checks the rest."""
    if not scan.complete:
        log.info(
            "%s: those of the first %d records checked in %.1f s; %s the rest as it reads them",
            labels,
            scan.checked,
            time.monotonic() - started,
            checked_later_by,
        )
