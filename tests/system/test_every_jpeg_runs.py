"""Every valid JPEG variant (Pillow's, cjpeg's sampling and coding ones, YCCK) with two records no
decoder here reads, end to end: resnet50-db bench with both crops and 0 and 2 input processes, and
one epoch of training, each exit 0 with the two bad records counted or named."""

from __future__ import annotations

from resnet50_trainer.tools.db import bench
from tests.support.dbfactory import datum_record, make_jpeg, write_db
from tests.support.jpeg_variants import (
    CJPEG_VARIANTS,
    PILLOW_VARIANTS,
    jpeg_variant,
    needs_cjpeg,
    with_precision,
)
from tests.support.trainer_runs import run_trainer

BAD_KEYS = (b"bad_12bit", b"bad_cut")


def corpus(tmp_path) -> str:
    names = [*PILLOW_VARIANTS, *CJPEG_VARIANTS, "YCCK"]
    whole = make_jpeg(40, 48)
    bad = [with_precision(whole, 12), whole[: len(whole) // 2]]
    return write_db(
        str(tmp_path / "db"),
        "lmdb",
        [(b"%02d" % i, datum_record(i % 4, encoded=jpeg_variant(n))) for i, n in enumerate(names)]
        + [(key, datum_record(0, encoded=jpeg)) for key, jpeg in zip(BAD_KEYS, bad)],
    )


@needs_cjpeg
def test_a_db_of_every_jpeg_variant_benches_and_trains_counting_its_bad_records(tmp_path, capsys):
    db = corpus(tmp_path)
    for crop in ("scale", "random_resized"):
        for workers in ("0", "2"):
            # 9 batches of 8: the second pass over the DB's 29 records is all timed.
            status = bench.main(
                [db, "--batch_size", "8", "--image_size", "32", "--batches", "8"]
                + ["--crop", crop, "--num_workers", workers]
            )
            *_, skipped, rate = capsys.readouterr().out.strip().splitlines()
            assert status == 0 and rate.startswith("images/sec: "), (crop, workers)
            assert skipped.startswith("skipped ") and "records that cannot be read" in skipped
    done = run_trainer(
        *("--train_data", db, "--num_epochs", "1", "--max_bad_records", "0.2"),
        *("--log_dir", str(tmp_path / "run")),
    )
    assert done.returncode == 0, done.stderr
    named = [line for line in done.stderr.splitlines() if "Skipped undecodable record" in line]
    assert sorted(named) == sorted(f"Skipped undecodable record {key!r}" for key in BAD_KEYS)
