"""Databases read by real runs and input processes: a test DB that is the training DB, LevelDB read
by two processes at once and left unchanged, input processes' LevelDB snapshots removed, an LMDB
read while another process writes it, or cut short while input processes read it."""

from __future__ import annotations

import multiprocessing
import os
import tempfile

import pytest

from resnet50_trainer.data.formats.databases import open_database
from resnet50_trainer.errors import UserError
from tests.support.dbfactory import (
    LIVE_VALUE_SIZE,
    LiveLmdbWriter,
    caffe_key,
    cut_short,
    datum_record,
    make_jpeg,
    write_db,
)
from tests.support.file_digests import _file_digests
from tests.support.image_records import records_of
from tests.support.trainer_runs import log_rows, run_trainer


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


def test_an_lmdb_reader_keeps_its_records_while_another_process_rewrites_them(tmp_path):
    """A writer reuses the pages of the records it replaced unless a reader's transaction in its
    reader table (lock.mdb) still reads them: unregistered (lock=False), the reader read pages
    half rewritten (MDB_CORRUPTED, or LMDB's assertions aborting the process)."""
    path = str(tmp_path / "db")
    with LiveLmdbWriter(path, 200) as writer, open_database(path, "lmdb") as database:
        first = bytes([writer.byte]) * LIVE_VALUE_SIZE
        viewed = database.view(b"00007")
        writer.rewrite()
        assert bytes(viewed) == first and database.get(b"00150") == first
        assert bytes(database.view(b"00199")) == first  # the view's transaction began before
        latest = bytes([writer.byte]) * LIVE_VALUE_SIZE
        assert {bytes(value) for _, value in database.items()} == {latest}  # one snapshot


def test_an_lmdb_cut_short_under_input_processes_ends_in_its_own_line(image_db):
    """data.mdb cut short once the keys are read: the input process's one-line refusal reaches
    the training process as the DataLoader re-raises it (its message torch's, the traceback),
    and is raised again with its own line."""
    import torch

    from resnet50_trainer.data.cpu_decode import CpuDecode
    from resnet50_trainer.data.input_pipeline import make_loader
    from resnet50_trainer.data.prefetch import DevicePrefetcher

    path = image_db("db", 40, 4)
    records = records_of(CpuDecode, path, train=False)
    loader = make_loader(records, [[0, 1], [2, 3]], 1, False)
    batches = DevicePrefetcher(loader, torch.device("cpu"), lambda batch: batch, allow_empty=True)
    cut_short(path)
    with pytest.raises(UserError) as refused:
        list(batches)
    assert str(refused.value).startswith(f"LMDB {path} is incomplete: its data.mdb is ")
    assert "\n" not in str(refused.value)


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


def test_a_run_whose_test_db_is_its_training_db_trains_and_tests(image_db, tmp_path):
    path = image_db("db", 16, 4)
    done = run_trainer(
        *("--train_data", path, "--test_data", path, "--num_epochs", "1"),
        *("--log_dir", str(tmp_path)),
    )
    assert done.returncode == 0, done.stderr
    assert float(log_rows(tmp_path)[0]["test_accuracy"]) >= 0  # -1: not tested
