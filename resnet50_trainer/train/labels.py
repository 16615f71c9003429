"""A training or test label outside the model's classes: its own error, named with the record, the
label and --num_labels, and the --num_labels (or test DB) that fits; never an unreadable record.
Found by preflight's scan (launch/preflight.py) or, past its time budget, as training reads the
record (and as the first test reads the test DB: train/evaluation.py)."""

from __future__ import annotations

from resnet50_trainer.config.settings import Config
from resnet50_trainer.config.values import NUM_LABELS
from resnet50_trainer.data.formats.databases import open_database
from resnet50_trainer.data.formats.keys import printable_key
from resnet50_trainer.data.formats.label_scan import LabelScan, scan_labels
from resnet50_trainer.errors import UserError
from resnet50_trainer.path_words import shown

# Seconds spent looking for the DB's highest label, which the fix names.
HIGHEST_LABEL_SCAN_S = 5.0


def scan_training_labels(config: Config, budget_s: float) -> LabelScan:
    """The training DB's labels against --num_labels, read on past the first one outside for
    the highest (within `budget_s`)."""
    with open_database(config.train_data, config.db_type) as database:
        return scan_labels(database.items(), config.num_labels, budget_s, past_outside=True)


def training_label_refusal(config: Config, key: bytes, label: int, scan: LabelScan) -> UserError:
    """The one line for training record `key`'s `label` outside 0..--num_labels-1; `scan`: what
    a scan of the DB found, for the fix."""
    highest = max(label, scan.highest if scan.highest is not None else label)
    if label < 0 or not NUM_LABELS.holds(highest + 1):
        fix = (
            f"no --num_labels fits a label of {label}: rebuild the DB with labels from 0 "
            "(resnet50-db create numbers the classes 0, 1, ...)"
        )
    elif scan.complete:
        fix = f"this DB has labels up to {highest}: --num_labels {highest + 1}"
    else:
        fix = (
            f"this DB has labels up to at least {highest} (in the {scan.checked} records "
            f"read): --num_labels {highest + 1} or more"
        )
    return UserError(
        f"--train_data {shown(config.train_data)} holds label {label} (key "
        f"{key.decode(errors='replace')}), outside 0..{config.num_labels - 1} of --num_labels "
        f"{config.num_labels}: {fix}"
    )


def test_label_refusal(test_data: str, label: int, num_labels: int, key: bytes = b"") -> UserError:
    """`test_data`: how the message names the DB ("--test_data PATH")."""
    named = f" (key {printable_key(key)})" if key else ""
    larger = NUM_LABELS.holds(label + 1)  # not for a negative label, nor past the flag's range
    larger_model = f", or a model of {label + 1} or more (--num_labels)" if larger else ""
    return UserError(
        f"{test_data} holds label {label}{named}, outside 0..{num_labels - 1}: use a test DB "
        f"of this model's {num_labels} classes{larger_model}"
    )


def refuse_training_label(config: Config, key: bytes, label: int) -> UserError:
    """The refusal for a label training met as it read the record: the DB scanned for its
    highest label first (bounded)."""
    scan = scan_training_labels(config, HIGHEST_LABEL_SCAN_S)
    return training_label_refusal(config, key, label, scan)
