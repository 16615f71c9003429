"""A training label outside 0..--num_labels-1 is its own error, not an unreadable record: one line
naming the label, the record and --num_labels, with the --num_labels that fits the DB; exit 2.
Preflight finds it with the test labels' scan; a label past the scan's time budget stops training
as it reads the record."""

from __future__ import annotations

from dbfactory import datum_record, make_jpeg, write_db
from resnet50_trainer.data.formats.databases import open_database
from resnet50_trainer.data.formats.label_scan import LabelScan, scan_labels
from resnet50_trainer.train.labels import training_label_refusal
from trainer_runs import HOOKS, REPOSITORY, config_of, refused_in_process, run_trainer

FIX_FOR_TEN = "outside 0..3 of --num_labels 4: this DB has labels up to 9: --num_labels 10"


def test_preflight_names_the_label_the_record_and_the_num_labels_that_fit(capsys, image_db):
    train = image_db("train", 16, 10)  # labels 0..9, the model has 4 classes
    line = refused_in_process(capsys, "--train_data", train)
    assert line.endswith(
        f"--train_data {train} holds label 4 (key 00000004_img4.jpg), {FIX_FOR_TEN}"
    ), line
    assert "could not be read" not in line and "repair" not in line


def test_a_label_past_preflights_scan_stops_training_with_the_same_line(image_db, tmp_path):
    """Preflight's budget at 0 s: training's input processes meet the label."""
    train = image_db("train", 16, 10)
    done = run_trainer(
        *("--train_data", train, "--num_gpus", "2", "--num_workers", "1"),
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
