"""LMDB and LevelDB readers and writers, on real databases in temporary directories."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import tempfile

import pytest

from dbfactory import caffe_key, datum_record, make_jpeg, write_db
from resnet50_trainer.data.formats.databases import DB_TYPES, open_database, open_writer
from resnet50_trainer.errors import UserError
from trainer_runs import log_rows, run_trainer

RECORDS = [(b"%03d" % index, b"value-%d" % index) for index in (5, 1, 3, 0, 2, 4)]


def _file_digests(path: str) -> dict:
    digests = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as file:
            digests[name] = hashlib.sha256(file.read()).hexdigest()
    return digests


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_reader_gives_sorted_keys_and_values(tmp_path, db_type):
    path = write_db(str(tmp_path / "db"), db_type, RECORDS)
    with open_database(path, db_type) as database:
        assert database.keys() == sorted(key for key, _ in RECORDS)
        assert len(database) == 6
        assert database.get(b"003") == b"value-3"
        with pytest.raises(UserError, match="not in database"):
            database.get(b"missing")


def test_wrong_paths_and_types_are_user_errors_with_the_fix(tmp_path):
    lmdb_path = write_db(str(tmp_path / "a_lmdb"), "lmdb", RECORDS)
    leveldb_path = write_db(str(tmp_path / "a_leveldb"), "leveldb", RECORDS)
    (tmp_path / "plain").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "data.mdb").write_bytes(b"\x00" * 8192)
    cases = [
        (
            lmdb_path,
            "leveldb",
            "is an LMDB database but --db_type leveldb was given; pass --db_type lmdb",
        ),
        (
            leveldb_path,
            "lmdb",
            "is a LevelDB database but --db_type lmdb was given; pass --db_type leveldb",
        ),
        (str(tmp_path / "nowhere"), "lmdb", "does not exist"),
        (str(tmp_path / "plain"), "lmdb", "holds neither an LMDB"),
        (str(tmp_path / "file"), "lmdb", "is a file, not a directory"),
        (lmdb_path, "rocksdb", "unknown database type"),
        (str(tmp_path / "broken"), "lmdb", "cannot open LMDB"),
    ]
    for path, db_type, message in cases:
        with pytest.raises(UserError, match=message):
            open_database(path, db_type)


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_empty_database_is_refused_unless_allowed(tmp_path, db_type):
    path = write_db(str(tmp_path / "db"), db_type, [])
    with pytest.raises(UserError, match="holds no records"):
        open_database(path, db_type)
    with open_database(path, db_type, allow_empty=True) as database:
        assert len(database) == 0


def _read_all(path: str, start, results) -> None:
    start.wait()
    with open_database(path, "leveldb") as database:
        results.put(sum(len(database.get(key)) for key in database.keys()))


def test_leveldb_is_read_by_two_processes_at_once_and_left_unchanged(tmp_path):
    # write_db leaves its records in LevelDB's log, so each reader has a log to recover.
    records = [(b"%05d" % index, os.urandom(300)) for index in range(2000)]
    path = write_db(str(tmp_path / "db"), "leveldb", records)
    before = _file_digests(path)
    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(2), context.Queue()
    readers = [context.Process(target=_read_all, args=(path, start, results)) for _ in range(2)]
    for reader in readers:
        reader.start()
    sizes = [results.get(timeout=30), results.get(timeout=30)]
    for reader in readers:
        reader.join(timeout=30)
    assert [reader.exitcode for reader in readers] == [0, 0]
    assert sizes == [300 * 2000] * 2
    with open_database(path, "leveldb") as database:  # and this process too, at the same time
        assert len(database) == 2000
    assert _file_digests(path) == before


def test_leveldb_reads_tables_through_links_and_removes_its_snapshot(tmp_path):
    path = str(tmp_path / "db")
    with open_writer(path, "leveldb") as writer:
        for key, value in RECORDS:
            writer.put(key, value)
    tables = sorted(name for name in os.listdir(path) if name.endswith(".ldb"))
    database = open_database(path, "leveldb")
    snapshot = database._snapshot
    assert tables and all(
        os.readlink(os.path.join(snapshot, name)) == os.path.join(path, name) for name in tables
    )
    assert database.get(b"002") == b"value-2"
    database.close()
    database.close()
    assert not os.path.exists(snapshot)


def test_lmdb_reader_writes_no_lock_file(tmp_path):
    path = str(tmp_path / "db")
    with open_writer(path, "lmdb") as writer:
        writer.put(b"k", b"v")
    with open_database(path, "lmdb") as database:
        assert database.get(b"k") == b"v"
    assert os.listdir(path) == ["data.mdb"]


def test_lmdb_writer_grows_its_map_as_needed(tmp_path):
    path = str(tmp_path / "db")
    chunk = os.urandom(1 << 20)
    with open_writer(path, "lmdb", batch_size=8) as writer:
        for index in range(40):  # 40 MiB, beyond the 16 MiB the map starts with
            writer.put(b"%02d" % index, chunk)
    with open_database(path, "lmdb") as database:
        assert len(database) == 40 and database.get(b"39") == chunk


def test_leveldb_writer_leaves_a_compacted_database_without_info_logs(tmp_path):
    path = str(tmp_path / "db")
    with open_writer(path, "leveldb", batch_size=7) as writer:
        for key, value in RECORDS:
            writer.put(key, value)
    names = os.listdir(path)
    assert "LOG" not in names and "LOG.old" not in names
    assert all(
        os.path.getsize(os.path.join(path, name)) == 0 for name in names if name.endswith(".log")
    )
    with open_database(path, "leveldb") as database:
        assert [database.get(key) for key in database.keys()] == [
            value for _, value in sorted(RECORDS)
        ]


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_writer_output_is_byte_reproducible(tmp_path, db_type):
    digests = []
    for run in range(2):
        path = str(tmp_path / f"db{run}")
        with open_writer(path, db_type, batch_size=2) as writer:
            for key, value in RECORDS:
                writer.put(key, value)
        digests.append(_file_digests(path))
        with open_database(path, db_type) as database:  # keys came unsorted, across batches
            assert [(key, database.get(key)) for key in database.keys()] == sorted(RECORDS)
    assert digests[0] == digests[1]


def test_writer_refuses_an_existing_path(tmp_path):
    with pytest.raises(UserError, match="already exists"):
        open_writer(str(tmp_path), "lmdb")


def test_input_processes_remove_their_leveldb_snapshots(tmp_path, monkeypatch):
    """DataLoader workers end with os._exit; their snapshots must not pile up in the temp dir."""
    from torch.utils.data import DataLoader

    from resnet50_trainer.data.cpu_decode import CpuDecode
    from resnet50_trainer.data.dataset import ImageRecords
    from resnet50_trainer.data.settings import InputSettings

    keys = [caffe_key(i, f"img{i}.jpg") for i in range(8)]
    db = write_db(
        str(tmp_path / "db"),
        "leveldb",
        [
            (key, datum_record(i % 2, encoded=make_jpeg(40, 48, seed=i)))
            for i, key in enumerate(keys)
        ],
    )
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))  # inherited by the forked workers
    settings = InputSettings(2, 3, 37, 32, 0, num_workers=2, decode_on_gpu=False)
    records = ImageRecords(db, "leveldb", keys, settings, train=False, decoding=CpuDecode(settings))
    loader = DataLoader(
        records,
        batch_sampler=[[0, 1, 2, 3], [4, 5, 6, 7]],
        num_workers=2,
        collate_fn=records.decoding.collate,
    )
    assert sum(len(batch.labels) for batch in loader) == 8  # each worker opened a snapshot
    del loader
    assert list(temporary.iterdir()) == []


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_one_db_opened_twice_in_a_process_reads_from_both(image_db, db_type):
    """--test_data may be --train_data: LMDB refuses a second open of an environment in one
    process, so the readers share it; closing one leaves the other reading."""
    path = image_db("db", 4, 2, db_type=db_type)
    first, second = open_database(path, db_type), open_database(path, db_type)
    keys = first.keys()
    assert second.keys() == keys
    first.close()
    assert second.get(keys[0]) and second.get(keys[-1])
    second.close()
    with open_database(path, db_type) as again:  # and it opens afresh after both closed
        assert again.keys() == keys


def test_a_run_whose_test_db_is_its_training_db_trains_and_tests(image_db, tmp_path):
    path = image_db("db", 16, 4)
    done = run_trainer(
        *("--train_data", path, "--test_data", path, "--num_epochs", "1"),
        *("--log_dir", str(tmp_path)),
    )
    assert done.returncode == 0, done.stderr
    assert float(log_rows(tmp_path)[0]["test_accuracy"]) >= 0  # -1: not tested
