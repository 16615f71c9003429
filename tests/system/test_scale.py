"""ImageNet-scale input costs: the keys are one shared buffer (input processes read them without
copying), and the preflight's test-label check reads labels without parsing images yet refuses
exactly what a full parse would."""

from __future__ import annotations

import multiprocessing
import os
import random
import subprocess
import sys

import lmdb
import numpy as np
import plyvel
import pytest

from benchmarks.make_scale_db import padded, scale_key, tiny_jpegs
from resnet50_trainer.data.dataset import ImageRecords
from resnet50_trainer.data.formats.databases import read_keys
from resnet50_trainer.data.formats.keys import KeyStore
from resnet50_trainer.data.formats.label_scan import quick_label
from resnet50_trainer.data.formats.records import parse_record
from resnet50_trainer.errors import RecordError
from tests.support.dbfactory import datum_record, tensorprotos_record
from tests.support.record_mutations import MUTATIONS, SEED, seed_values
from tests.support.trainer_runs import REPOSITORY, refused_beside


def make_scale_db(
    path: str, records: int, db_type: str, record_format: str = "datum", labels: int = 1000
) -> str:
    command = [sys.executable, "-m", "benchmarks.make_scale_db", path]
    flags = ["--records", str(records), "--db_type", db_type, "--format", record_format]
    flags += ["--labels", str(labels)]
    environment = {**os.environ, "PYTHONPATH": REPOSITORY}
    subprocess.run(
        command + flags + ["--record_bytes", "4000"], check=True, cwd=REPOSITORY, env=environment
    )
    return path


def test_keys_are_one_buffer_and_offsets(tmp_path):
    path = make_scale_db(str(tmp_path / "db"), 300, "lmdb")
    keys = read_keys(path, "lmdb")
    assert isinstance(keys, KeyStore)
    arrays = [value for value in vars(keys).values() if isinstance(value, np.ndarray)]
    assert len(arrays) == len(vars(keys)) == 2  # no list of key objects anywhere
    assert list(keys) == [scale_key(index, 1000) for index in range(300)]
    assert isinstance(keys[:200], KeyStore) and keys[:200]._buffer is keys._buffer
    records = ImageRecords(path, "lmdb", keys, None, False, None)  # type: ignore[arg-type]
    assert records.keys is keys


@pytest.mark.parametrize(
    "keys", [[], [b""], [b"a", b"", b"tail\0", b"\0", b"x" * 511], [b"%08d" % i for i in range(50)]]
)
def test_key_store_reads_like_the_list(keys):
    store = KeyStore.pack(keys)
    assert len(store) == len(keys) and list(store) == keys
    for index in range(-len(keys), len(keys)):
        assert store[index] == keys[index]
    for piece in (slice(None, 3), slice(2, None), slice(5, 1), slice(None, None, 7), slice(-2, 99)):
        assert list(store[piece]) == keys[piece]
    with pytest.raises(IndexError):
        store[len(keys)]


def _read_all_and_report(keys: KeyStore, results) -> None:
    def private_kib() -> int:
        with open("/proc/self/smaps_rollup") as rollup:
            fields = dict(line.split(":", 1) for line in rollup if line.rstrip().endswith("kB"))
        return sum(int(fields[name].split()[0]) for name in ("Private_Clean", "Private_Dirty"))

    before = private_kib()
    read = sum(len(keys[index]) for index in range(len(keys)))
    results.put((read, private_kib() - before))


def test_a_forked_input_process_reading_every_key_copies_none(tmp_path):
    """200,000 keys are ~20 MB as a list of bytes objects, which a reader would copy page by page
    (reference counts); the store's pages stay shared: the child's private memory barely grows."""
    keys = [scale_key(index, 1000) for index in range(200_000)]
    store, total = KeyStore.pack(keys), sum(map(len, keys))
    del keys
    context = multiprocessing.get_context("fork")  # as the DataLoader starts input processes
    results = context.Queue()
    child = context.Process(target=_read_all_and_report, args=(store, results))
    child.start()
    read, grown_kib = results.get(timeout=120)
    child.join()
    assert read == total
    assert grown_kib < 2048, f"the child copied {grown_kib} KiB reading the keys"


def put_record(path: str, db_type: str, key: bytes, value: bytes) -> None:
    if db_type == "lmdb":
        with lmdb.open(path, subdir=True) as env, env.begin(write=True) as txn:
            txn.put(key, value)
    else:
        database = plyvel.DB(path)
        database.put(key, value)
        database.close()


@pytest.mark.parametrize("db_type, record_format", [("lmdb", "datum"), ("leveldb", "tensorprotos")])
def test_a_bad_test_label_after_many_good_records_is_refused(
    capsys, tmp_path, image_db, db_type, record_format
):
    test = make_scale_db(str(tmp_path / "test"), 2000, db_type, record_format, labels=4)
    make = datum_record if record_format == "datum" else tensorprotos_record
    put_record(test, db_type, b"99999999_last.JPEG", make(4, encoded=tiny_jpegs(1)[0]))
    train = image_db("train", 16, 4, db_type=db_type)
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    line = refused_beside(
        capsys, earlier, "--train_data", train, "--test_data", test, "--db_type", db_type
    )
    assert "holds label 4 (key 99999999_last.JPEG)" in line
    assert "or a model of 5 or more (--num_labels)" in line


def test_quick_labels_agree_with_full_parses_of_damaged_records():
    """Wherever a record parses, a quick label is its label (or None: parse it in full)."""
    rng = random.Random(SEED)
    checked = quick = 0
    jpeg = padded(tiny_jpegs(1)[0], 3000)
    for base in [*seed_values(), datum_record(-7, encoded=jpeg)]:
        for _ in range(300):
            value = base
            for _ in range(rng.randint(0, 3)):
                value = rng.choice(MUTATIONS)(value, rng) if value else value
            try:
                label = parse_record(value).label
            except RecordError:
                continue
            checked += 1
            found = quick_label(value)
            quick += found is not None
            assert found in (None, label), value
    assert checked > 1000 and quick > checked // 2
