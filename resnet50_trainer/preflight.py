"""The run's inputs checked once, in the launching process, before any training process starts and
before any file is written: a bad input ends the run with one line naming the fix (exit 2)."""

from __future__ import annotations

import errno
import logging
import os
import tempfile
import time

import torch

from resnet50_trainer import (
    checkpoint,
    checkpoint_schema,
    compression_checkpoint,
    grad_compression,
)
from resnet50_trainer.auto_resume import check_same_run, resume_path
from resnet50_trainer.checkpoint_lock import CheckpointLock, lock_checkpoints
from resnet50_trainer.config import Config
from resnet50_trainer.data.databases import open_database
from resnet50_trainer.data.label_scan import quick_label
from resnet50_trainer.data.records import decode_image, parse_record
from resnet50_trainer.errors import RecordError, UserError
from resnet50_trainer.evaluation import test_label_refusal
from resnet50_trainer.initial_weights import read_init_model
from resnet50_trainer.model import model_for
from resnet50_trainer.optim import build_optimizer

log = logging.getLogger(__name__)
# Seconds preflight spends on the test labels: a cold ImageNet test DB (6 GB) takes minutes to
# read, so the first test checks what is left as it reads it (evaluation.py).
LABEL_SCAN_S = 5.0
# Records sampled, evenly over the DB, to tell a DB of images from one of something else. A DB
# with a few bad records passes (they are skipped while training); one where all fail does not.
RECORDS_SAMPLED = 16
# A step count within an epoch that no run reaches (10^12 steps), for the longest checkpoint name.
LARGEST_STEP = 10**12


def check_inputs(config: Config, writes_checkpoints: bool = True) -> CheckpointLock | None:
    """`writes_checkpoints`: this process runs (or launches) global rank 0, which writes the
    checkpoints (and alone reads --init_model); it then takes the checkpoints' lock, returned for
    the caller to hold until the run ends. A --test_only run reads no training DB and writes
    nothing: it needs no writable directory and takes no lock."""
    check_checkpoint_name(config.save_model_name)
    grad_compression.check_supported(config)
    if not config.test_only:
        check_outputs_writable(config)
        if not config.synthetic:
            _check_holds_images(config)
    if config.test_data is not None:
        _check_test_labels(config, config.test_data, LABEL_SCAN_S)
    resumed = None
    source = resume_path(config)
    if source:
        resumed = checkpoint.load_checkpoint(source, config.save_model_name, warn=False)
        check_checkpoint(resumed, config)
        check_same_run(resumed, config)
    if config.init_model and writes_checkpoints:
        read_init_model(config.init_model, config, say=False)
    if config.test_only or not writes_checkpoints:
        return None
    return _claim_checkpoint_names(config, resumed)


def check_checkpoint(state: dict, config: Config) -> None:
    """The checkpoint `state` is of this run's model: architecture, labels, tensor shapes."""
    checkpoint_schema.check_matches(state, config)
    with torch.device("meta"):  # shapes only: nothing is allocated or initialised for real
        model = model_for(config)
        optimizer = None if config.test_only else build_optimizer(model, config)
        checkpoint_schema.check_fits(state, model, optimizer)
        compression_checkpoint.check_fits(state, model, config)


def check_checkpoint_name(name: str) -> None:
    """A name that is no plain file name would write elsewhere, or fail after an epoch."""
    separators = {separator for separator in ("/", os.sep, os.altsep) if separator is not None}
    problems = (
        (not name, "is empty"),
        (any(separator in name for separator in separators), "has a directory part"),
        ("\0" in name, "holds a NUL character"),
        (any(not character.isprintable() for character in name), "holds a control character"),
        (
            name.startswith(checkpoint.TEMPORARY_PREFIX),
            f"starts with {checkpoint.TEMPORARY_PREFIX}, which marks temporary files",
        ),
        # "." and ".." would name hidden files ("._1.pt", ".._1.pt").
        (name.startswith("."), "starts with '.', which hides files"),
    )
    problem = next((problem for found, problem in problems if found), None)
    if problem:
        raise UserError(
            f"--save_model_name {_shown(name)} {problem}: give a plain file name "
            "stem, and the directory as --checkpoint_dir"
        )


def _check_checkpoint_names_fit(config: Config) -> None:
    """Create and delete a file of the longest name the run writes (a temporary file's, with a
    step count no epoch reaches): a name too long for the file system fails here, not after an
    epoch. The probe's random part holds a capital letter, which mkstemp never writes: no run's
    clean-up of temporary files takes it for one, and its process id sets it apart."""
    longest = checkpoint.temporary_name(
        config.save_model_name, config.num_epochs, LARGEST_STEP, f"P{os.getpid() % 10**7:07d}"
    )
    probe = os.path.join(config.checkpoint_dir, longest)
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as error:
        fix = (
            "choose a shorter name"
            if error.errno == errno.ENAMETOOLONG
            else "make --checkpoint_dir writable, with room for a file, or choose another"
        )
        raise UserError(
            f"--save_model_name {_shown(config.save_model_name)} cannot name "
            f"checkpoints in --checkpoint_dir {config.checkpoint_dir} "
            f"({error.strerror}): {fix}"
        ) from None


def _claim_checkpoint_names(config: Config, resumed: dict | None) -> CheckpointLock:
    """This run's checkpoint names are its own: take their lock (a second live run refuses), make
    sure no other run's checkpoints carry them (a fresh run: none at all of this name; a resumed
    one: none of another lineage), then clear the temporary files killed writers left."""
    directory, name = config.checkpoint_dir, config.save_model_name
    _check_checkpoint_names_fit(config)
    lock = lock_checkpoints(directory, name)
    try:
        lineage = None if resumed is None else checkpoint.lineage_of(resumed, directory)
        others = checkpoint.checkpoints_of_other_runs(directory, name, lineage)
        if others:
            whose = "another run" if resumed is None else f"another run than {resumed['path']}'s"
            raise UserError(
                f"--checkpoint_dir {directory} holds checkpoints of {whose} (newest: "
                f"{others[-1].path}), which this run would replace or delete: resume "
                f"that run with --load_model_path {directory}, or give this run "
                "another --checkpoint_dir or --save_model_name"
            )
        checkpoint.remove_temporary_files(directory, name)
    except BaseException:
        lock.release()
        raise
    return lock


def check_outputs_writable(config: Config) -> None:
    """Fail before any work if the log or checkpoint directory cannot take files."""
    for flag, directory in (
        ("--log_dir", config.log_dir),
        ("--checkpoint_dir", config.checkpoint_dir),
    ):
        try:
            os.makedirs(directory, exist_ok=True)
            with tempfile.TemporaryFile(dir=directory):
                pass
        except OSError as error:
            # makedirs says "File exists" where a file stands in the directory's place.
            reason = "a file, not a directory" if os.path.isfile(directory) else error.strerror
            raise UserError(
                f"{flag} {directory} cannot be written ({reason}): choose a writable directory"
            ) from None


def _shown(name: str) -> str:
    return repr(name) if len(name) <= 60 else f"{name[:40]!r}... ({len(name)} characters)"


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
        f"--train_data {config.train_data}: none of {len(sampled)} records sampled is "
        f"an image (e.g. key {key.decode(errors='replace')}: {first_error}): "
        "give a DB of Caffe Datum or Caffe2 TensorProtos image records"
    )


def _check_test_labels(config: Config, test_data: str, budget_s: float) -> None:
    """Every test label the test reads (--test_epoch_size) must be a class of the model: checked
    here for `budget_s` seconds, and by the first test for what is left. The scan reads each
    record's label from its wire format (label_scan.py: the image bytes are stepped over, not
    read); only a record it cannot tell, or whose label is out of range, is parsed in full, and it
    decodes no image."""
    started = time.monotonic()
    tested = config.test_epoch_size  # the test reads the first records only (None: all)
    with open_database(test_data, config.db_type) as database:
        for checked, (key, value) in enumerate(database.items()):
            if checked == tested:
                return
            if checked % 256 == 0 and time.monotonic() - started > budget_s:
                log.info(
                    "Test labels: those of the first %d records checked in %.1f s; the first test "
                    "checks the rest as it reads them",
                    checked,
                    time.monotonic() - started,
                )
                return
            label = quick_label(value)
            if label is None or not 0 <= label < config.num_labels:
                try:
                    label = parse_record(bytes(value)).label
                except RecordError:
                    continue  # skipped and not scored during evaluation, like a bad training record
            if not 0 <= label < config.num_labels:
                raise test_label_refusal(f"--test_data {test_data}", label, config.num_labels, key)
