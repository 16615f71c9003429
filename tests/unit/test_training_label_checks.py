"""A training label outside 0..--num_labels-1 is its own error, not an unreadable record: one line
naming the label, the record and --num_labels, with the --num_labels that fits the DB (exit 2).
Here: preflight's refusal (in-process, nothing spawned), the bounded scan, the message's fixes,
and both decode strategies carrying the label to the training loop instead of a bad key."""

from __future__ import annotations

import torch

from resnet50_trainer.data.batch import TrainingLabelOutside, require_records
from resnet50_trainer.data.cpu_decode import CpuDecode
from resnet50_trainer.data.dataset import DecodeStrategy, ImageRecords
from resnet50_trainer.data.formats.databases import open_database, read_keys
from resnet50_trainer.data.formats.label_scan import LabelScan, scan_labels
from resnet50_trainer.data.gpu_decode import GpuDecode
from resnet50_trainer.data.settings import InputSettings
from resnet50_trainer.train.labels import training_label_refusal
from tests.support.dbfactory import datum_record, make_jpeg, write_db
from tests.support.trainer_runs import config_of, refused_in_process

FIX_FOR_TEN = "outside 0..3 of --num_labels 4: this DB has labels up to 9: --num_labels 10"


def test_preflight_names_the_label_the_record_and_the_num_labels_that_fit(capsys, image_db):
    train = image_db("train", 16, 10)  # labels 0..9, the model has 4 classes
    line = refused_in_process(capsys, "--train_data", train)
    assert line.endswith(
        f"--train_data {train} holds label 4 (key 00000004_img4.jpg), {FIX_FOR_TEN}"
    ), line
    assert "could not be read" not in line and "repair" not in line


def labels_db(tmp_path, labels: list[int]) -> str:
    jpeg = make_jpeg(40, 48)
    records = [(b"%08d" % i, datum_record(label, encoded=jpeg)) for i, label in enumerate(labels)]
    return write_db(str(tmp_path / "db"), "lmdb", records)


def scan(path: str, num_labels: int, budget_s: float = 60.0, **kwargs) -> LabelScan:
    with open_database(path, "lmdb") as database:
        return scan_labels(database.items(), num_labels, budget_s, **kwargs)


def test_the_scan_reads_past_the_first_label_outside_for_the_highest(tmp_path):
    path = labels_db(tmp_path, [0, 1, 7, 2, 12, 3])
    assert scan(path, 4) == LabelScan(3, False, (b"00000002", 7), 7)
    assert scan(path, 4, past_outside=True) == LabelScan(6, True, (b"00000002", 7), 12)
    assert scan(path, 4, limit=2) == LabelScan(2, True, None, 1)
    assert scan(path, 4, budget_s=0) == LabelScan(0, False, None, None)


def test_a_label_no_num_labels_fits_asks_for_the_db_rebuilt(tmp_path):
    config = config_of("--use_cpu", "--train_data", "null", "--num_labels", "4")
    for label in (-1, 2**31 - 1):
        refusal = training_label_refusal(config, b"k", label, LabelScan(1, True, None, label))
        assert f"holds label {label} (key k), outside 0..3 of --num_labels 4: no " in str(refusal)
        assert "rebuild the DB with labels from 0" in str(refusal)


def test_a_partial_scan_says_at_least(tmp_path):
    config = config_of("--use_cpu", "--train_data", "null", "--num_labels", "4")
    refusal = training_label_refusal(config, b"k", 5, LabelScan(300, False, (b"k", 5), 8))
    assert str(refusal).endswith(
        "this DB has labels up to at least 8 (in the 300 records read): --num_labels 9 or more"
    )


def test_both_decode_strategies_carry_the_label_to_the_training_loop(image_db):
    """Records 4..7 have labels 4..7, outside 4 classes: a batch of some, or only, such records."""
    db = image_db("train", 8, 10)
    keys = read_keys(db, "lmdb")
    for strategy in (CpuDecode, GpuDecode):
        settings = InputSettings(4, 3, 37, 32, 0, 0, strategy is GpuDecode)
        decoding: DecodeStrategy = strategy(settings)
        records = ImageRecords(db, "lmdb", keys, settings, True, decoding)
        for indices in (range(8), range(5, 8)):
            batch = decoding.collate([records[(i, i)] for i in indices])
            staged = decoding.stage(torch.device("cpu"))(batch)
            try:
                require_records(staged)
                raise AssertionError(f"{strategy.__name__}: no refusal")
            except TrainingLabelOutside as outside:
                first = indices[0] if indices[0] >= 4 else 4
                assert (outside.key, outside.label) == (b"%08d_img%d.jpg" % (first, first), first)
