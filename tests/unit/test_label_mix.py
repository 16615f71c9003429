"""The start's check that quasi-random order mixes a DB's labels: a DB in label order read through
windows too small for it (--read_window_mb) is named with the fix; a shuffled DB, or one window,
is not. And --read_window_mb is refused where it shapes nothing (random order)."""

from __future__ import annotations

import pytest

from resnet50_trainer.cli import main
from resnet50_trainer.data.formats.databases import read_keys
from resnet50_trainer.data.label_mix import expected_labels, poor_mix_warning
from resnet50_trainer.data.order import RecordOrder
from resnet50_trainer.data.settings import database_bytes, resolve_read_order
from resnet50_trainer.tools.db import bench
from tests.support.dbfactory import datum_record, make_jpeg, write_db

GIB = 2**30
RECORDS, CLASSES = 3000, 10


def labelled_db(path, label_of) -> str:
    """3,000 records of one ~4 KB JPEG: runs of about 130 records, 1 MB windows of 2 runs."""
    jpeg = make_jpeg(48, 48, quality=100)
    records = [
        (b"%08d" % index, datum_record(label_of(index), encoded=jpeg)) for index in range(RECORDS)
    ]
    return write_db(str(path), "lmdb", records)


def in_label_order(index: int) -> int:
    return index * CLASSES // RECORDS


def shuffled_labels(index: int) -> int:
    return index * 7 % CLASSES


def mix_warning(db: str, window_mb: int, batch: int = 32) -> str | None:
    keys = read_keys(db, "lmdb")
    order = resolve_read_order(
        "quasi_random", len(keys), database_bytes(db), 64 * GIB, False, window_mb
    )
    assert order.run_length > 100
    return poor_mix_warning(
        db, "lmdb", keys, RecordOrder(len(keys), 0, *order.shape), window_mb, batch
    )


def test_a_db_in_label_order_read_through_small_windows_is_named_with_the_fix(tmp_path):
    warning = mix_warning(labelled_db(tmp_path / "sorted", in_label_order), window_mb=1)
    assert warning is not None and "\n" not in warning
    assert "a window of 1 MB (2 runs of" in warning
    assert "raise --read_window_mb" in warning and "resnet50-db copy --shuffle" in warning


@pytest.mark.parametrize(
    ("label_of", "window_mb"),
    [(shuffled_labels, 1), (in_label_order, 64)],
    ids=["shuffled DB", "one window"],
)
def test_a_shuffled_db_or_one_window_passes(tmp_path, label_of, window_mb):
    assert mix_warning(labelled_db(tmp_path / "db", label_of), window_mb) is None


def test_random_order_reads_nothing(tmp_path):
    missing = str(tmp_path / "never opened")
    assert poor_mix_warning(missing, "lmdb", [b"k"] * 10, RecordOrder(10, 0), 1, 4) is None


def test_a_random_batchs_labels_are_expected_from_the_db_s_shares():
    assert expected_labels([0, 1] * 50, 1) == pytest.approx(1.0)
    assert expected_labels(list(range(1000)), 256) == pytest.approx(1000 * (1 - 0.999**256))
    assert expected_labels([3] * 9 + [4], 2) == pytest.approx((1 - 0.1**2) + (1 - 0.9**2))


def test_bench_says_so_in_one_line(tmp_path, capsys):
    db = labelled_db(tmp_path / "sorted", in_label_order)
    arguments = [db, "--read_order", "quasi_random", "--read_window_mb", "1", "--batch_size", "32"]
    assert (
        bench.main([*arguments, "--batches", "1", "--num_workers", "0", "--image_size", "32"]) == 0
    )
    warnings = [line for line in capsys.readouterr().out.splitlines() if "Warning" in line]
    assert len(warnings) == 1 and "mixes this DB's labels poorly" in warnings[0]


@pytest.mark.parametrize("command", ["trainer", "bench"])
def test_a_window_for_random_order_is_refused_in_one_line(image_db, capsys, command):
    flags = ["--read_order", "random", "--read_window_mb", "64"]
    if command == "bench":
        assert bench.main([image_db("db", 4, 2), *flags]) == 2
    else:
        assert main(["--train_data", "null", "--use_cpu", *flags]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "--read_window_mb shapes the windows of --read_order quasi_random" in line
    assert "leave --read_window_mb out" in line
