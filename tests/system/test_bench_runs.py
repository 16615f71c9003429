"""resnet50-db bench and the input pipeline run for real: the bench command in a fresh interpreter,
input processes, a run whose batch holds only bad records."""

from __future__ import annotations

import pytest
import torch

from resnet50_trainer.data.cpu_decode import CpuDecode
from resnet50_trainer.data.gpu_decode import GpuDecode
from resnet50_trainer.data.input_pipeline import make_loader
from resnet50_trainer.data.prefetch import DevicePrefetcher
from resnet50_trainer.errors import UserError
from resnet50_trainer.tools.db import bench
from tests.support.dbfactory import (
    write_db,
)
from tests.support.image_records import records_of
from tests.support.trainer_runs import run_python, running

CPU = torch.device("cpu")


def test_bench_prints_images_per_second_last(image_db, capsys):
    db = image_db("bench", 12, 4)
    status = bench.main(
        [db, "--batch_size", "4", "--image_size", "32", "--num_workers", "1", "--batches", "5"]
    )
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert status == 0 and last.startswith("images/sec: ") and float(last.split()[-1]) > 0


# A process that ends with its input processes still running (a loader it never closed): they
# ignore stop signals, so multiprocessing's exit, which SIGTERMs them and joins, would wait forever.
LEFT_RUNNING = """
import sys
from resnet50_trainer.data.cpu_decode import CpuDecode
from resnet50_trainer.data.dataset import ImageRecords
from resnet50_trainer.data.formats.databases import read_keys
from resnet50_trainer.data.input_pipeline import make_loader
from resnet50_trainer.data.settings import InputSettings
db, db_type = sys.argv[1:]
settings = InputSettings(2**31 - 1, 3, 36, 32, 0, 2, False)
records = ImageRecords(db, db_type, read_keys(db, db_type), settings, True, CpuDecode(settings))
batches = iter(make_loader(records, [[(0, 0), (1, 1)], [(2, 2), (3, 3)]], 2, pin_memory=False))
next(batches)
print(*(worker.pid for worker in batches._workers), flush=True)
"""


@pytest.mark.parametrize("db_type", ["lmdb", "leveldb"])
def test_a_process_ending_with_its_input_processes_running_ends_them_cleanly(
    image_db, tmp_path, db_type
):
    """They end before it does, through their own exit: each one's LevelDB snapshot is removed."""
    db = image_db("left", 8, 4, db_type=db_type)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = run_python(LEFT_RUNNING, db, db_type, TMPDIR=str(scratch))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    workers = [int(pid) for pid in done.stdout.split()]
    assert len(workers) == 2 and not [pid for pid in workers if running(pid)]
    assert list(scratch.iterdir()) == []  # no resnet50-leveldb-* snapshot left behind


def test_prefetcher_yields_the_plain_loaders_batches(image_db):
    db = image_db("train", 12, 4)
    order = [[(p, (p * 5) % 12) for p in range(s * 4, s * 4 + 4)] for s in range(3)]
    plain = list(make_loader(records_of(CpuDecode, db), order, 0, pin_memory=False))
    loader = make_loader(records_of(CpuDecode, db), order, 1, pin_memory=False)
    fetched = list(DevicePrefetcher(loader, CPU, CpuDecode.stage(CPU)))
    assert len(fetched) == len(plain) == 3
    for ours, theirs in zip(fetched, plain):
        assert torch.equal(ours.images, theirs.images) and torch.equal(ours.labels, theirs.labels)


def test_a_batch_of_only_bad_records_stops_the_run_in_the_training_process(tmp_path):
    """Raised in an input process, the error would reach the user inside its traceback. Evaluation
    (allow_empty) gets the batch empty, with its keys, to count them."""
    db = write_db(
        str(tmp_path / "garbage"),
        "lmdb",
        [(b"%08d_x" % i, b"\x08\x01 not a record") for i in range(4)],
    )
    for decoding in (CpuDecode, GpuDecode):
        records = records_of(decoding, db)
        loader = make_loader(records, [[(p, p) for p in range(4)]], 1, False)
        stage = records.decoding.stage(CPU)
        with pytest.raises(UserError) as raised:
            list(DevicePrefetcher(loader, CPU, stage))
        assert str(raised.value).startswith("every record of a batch failed to decode")
        (empty,) = DevicePrefetcher(loader, CPU, stage, allow_empty=True)
        assert len(empty.labels) == 0 and len(empty.bad_keys) == 4
