"""Bad input at start: one line naming the problem and the fix, exit 2, no traceback, and no file
of an earlier run touched. The command line runs in-process; nothing is spawned before the
checks."""

from __future__ import annotations

import math
import os

import pytest
import torch

from resnet50_trainer.checkpoint import files as checkpoint_files
from resnet50_trainer.errors import UserError
from resnet50_trainer.launch.preflight import _check_test_labels
from resnet50_trainer.model.resnet import build_model
from tests.support.dbfactory import cut_short, datum_record, make_jpeg, write_db
from tests.support.trainer_runs import config_of, refused_beside


@pytest.fixture
def earlier_run(tmp_path):
    """A directory holding an earlier run's log and checkpoint, which no failed start may touch."""
    directory = tmp_path / "earlier"
    directory.mkdir()
    (directory / "resnet50_gpu1_b8_L4_lr0.10_v2_20260101_000000.log").write_text("# earlier\n")
    (directory / "resnet50_model_1.pt").write_bytes(b"earlier checkpoint")
    return directory


def test_missing_train_path(capsys, earlier_run, tmp_path):
    line = refused_beside(capsys, earlier_run, "--train_data", str(tmp_path / "nowhere"))
    assert "does not exist" in line and "give the path" in line


@pytest.mark.parametrize("made, given", [("leveldb", "lmdb"), ("lmdb", "leveldb")])
def test_database_of_the_other_type(capsys, earlier_run, image_db, made, given):
    path = image_db("db", 16, 4, db_type=made)
    line = refused_beside(capsys, earlier_run, "--train_data", path, "--db_type", given)
    assert f"pass --db_type {made}" in line


def test_empty_database(capsys, earlier_run, tmp_path):
    path = write_db(str(tmp_path / "empty"), "lmdb", [])
    line = refused_beside(capsys, earlier_run, "--train_data", path)
    assert "holds no records" in line


@pytest.mark.parametrize("flag", ["--train_data", "--test_data"])
def test_an_lmdb_cut_short_is_refused_and_no_folder_is_made(
    capsys, earlier_run, image_db, tmp_path, flag
):
    """A page past data.mdb's end would kill the run (SIGBUS, exit 135, nothing said); the
    refusal comes before the log and checkpoint folders are made."""
    cut = cut_short(image_db("cut", 40, 4))
    data = [flag, cut] if flag == "--train_data" else ["--train_data", image_db("db", 16, 4)]
    outputs = ["--checkpoint_dir", str(tmp_path / "checkpoints")]
    line = refused_beside(capsys, earlier_run, *data, *outputs, "--test_data", cut)
    assert f"LMDB {cut} is incomplete" in line and "copy it again from its source" in line
    assert not os.path.exists(tmp_path / "checkpoints")


def test_records_that_are_not_images(capsys, earlier_run, tmp_path):
    records = [(b"%08d" % i, b"\x08\x01not an image at all %d" % i) for i in range(16)]
    path = write_db(str(tmp_path / "garbage"), "lmdb", records)
    line = refused_beside(capsys, earlier_run, "--train_data", path)
    assert "none of 16 records sampled is an image" in line


def test_test_labels_above_num_labels(capsys, earlier_run, image_db):
    train = image_db("train", 16, 4)
    test = image_db("test", 16, 6)  # labels 0..5, the model has 4 classes
    line = refused_beside(capsys, earlier_run, "--train_data", train, "--test_data", test)
    assert "holds label 4" in line and "or a model of 5 or more (--num_labels)" in line


def test_a_test_label_no_model_could_have_is_refused_without_suggesting_one(
    capsys, earlier_run, image_db, tmp_path
):
    """--num_labels goes to 1000000: label 2147483647 is fixed by the test DB alone."""
    record = datum_record(2**31 - 1, encoded=make_jpeg(40, 48))
    test = write_db(str(tmp_path / "test"), "lmdb", [(b"00000000_a.jpg", record)])
    line = refused_beside(
        capsys, earlier_run, "--train_data", image_db("train", 16, 4), "--test_data", test
    )
    assert line.endswith(
        "holds label 2147483647 (key 00000000_a.jpg), outside 0..3: use a test DB of this "
        "model's 4 classes"
    )


@pytest.mark.parametrize("test_epoch_size, refused", [(None, True), ("8", False), ("9", True)])
def test_preflight_checks_only_the_test_labels_the_test_reads(
    image_db, tmp_path, test_epoch_size, refused
):
    """The test reads the first --test_epoch_size records in key order: a bad label beyond them
    is refused by neither preflight nor the test."""
    jpeg = make_jpeg(40, 48)
    records = [(b"%08d" % i, datum_record(i % 4 if i < 8 else 7, encoded=jpeg)) for i in range(12)]
    test = write_db(str(tmp_path / "test"), "lmdb", records)
    size = ["--test_epoch_size", test_epoch_size] if test_epoch_size else []
    config = config_of(
        "--use_cpu", "--num_labels", "4", "--train_data", "null", "--test_data", test, *size
    )
    if refused:
        with pytest.raises(UserError, match="holds label 7 \\(key 00000008\\)"):
            _check_test_labels(config, test, math.inf)
    else:
        _check_test_labels(config, test, math.inf)


@pytest.mark.parametrize("layers, labels, flag", [(34, 4, "num_layers"), (18, 10, "num_labels")])
def test_checkpoint_of_another_model(capsys, earlier_run, image_db, tmp_path, layers, labels, flag):
    path = str(tmp_path / "other_1.pt")
    model = build_model(layers, labels, 3)
    arguments = {"num_layers": layers, "num_labels": labels, "num_channels": 3}
    state: dict[str, object] = dict.fromkeys(checkpoint_files.REQUIRED_KEYS, 0)
    state.update(
        model=model.state_dict(),
        arguments=arguments,
        global_batch_size=8,
        world_size=1,
        optimizer={"state": {}, "param_groups": []},
        torch_rng_state=torch.get_rng_state(),
        epoch_sums=None,
    )
    checkpoint_files.save_checkpoint(state, path)
    line = refused_beside(
        capsys, earlier_run, "--train_data", image_db("db", 16, 4), "--load_model_path", path
    )
    assert f"was made with --{flag}" in line


def test_not_a_checkpoint(capsys, earlier_run, image_db, tmp_path):
    path = tmp_path / "junk.pt"
    path.write_bytes(b"not a checkpoint")
    line = refused_beside(
        capsys, earlier_run, "--train_data", image_db("db", 16, 4), "--load_model_path", str(path)
    )
    assert "not a readable checkpoint" in line


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_checkpoint_path_that_is_no_regular_file(capsys, earlier_run, image_db, tmp_path, kind):
    """A FIFO would block the read forever (no writer), a device never end: refused at once."""
    if kind == "fifo":
        path = str(tmp_path / "checkpoint_files.pt")
        os.mkfifo(path)
    else:
        path = "/dev/zero"
    line = refused_beside(
        capsys, earlier_run, "--train_data", image_db("db", 16, 4), "--load_model_path", path
    )
    assert f"--load_model_path {path} is not a regular file" in line


def test_checkpoint_without_resume_state(capsys, earlier_run, image_db, tmp_path):
    path = str(tmp_path / "weights_only.pt")
    torch.save({"model": build_model(18, 4, 3).state_dict()}, path)
    line = refused_beside(
        capsys, earlier_run, "--train_data", image_db("db", 16, 4), "--load_model_path", path
    )
    assert "lacks arguments, epoch, epoch_seconds" in line and "too old to resume" in line


@pytest.mark.parametrize("flag", ["--log_dir", "--checkpoint_dir"])
def test_directory_that_cannot_be_written(capsys, earlier_run, image_db, tmp_path, flag):
    # Root may write anywhere, so the directory is made impossible: its parent is a file.
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    line = refused_beside(
        capsys, earlier_run, "--train_data", image_db("db", 16, 4), flag, str(blocker / "logs")
    )
    assert f"{flag} {blocker / 'logs'} cannot be written" in line
