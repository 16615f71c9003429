"""--test_only (a checkpoint's test accuracy, nothing written) and --init_model (a fresh run from
a checkpoint's or a torchvision state dict's weights, the classifier replaced for new labels)."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest
import torch
from torchvision import models

from resnet50_trainer.checkpoint.lock import lock_checkpoints
from resnet50_trainer.errors import PREEMPTED_EXIT_STATUS
from tests.support.dbfactory import caffe_key, datum_record, make_jpeg, write_db, write_image_db
from tests.support.trainer_runs import (
    HOOKS,
    REPOSITORY,
    RUN_TIMEOUT_S,
    SMALL_RUN,
    files,
    one_error_line,
    read_log,
    refused_in_process,
    run_trainer,
    start_trainer,
)

ACCURACY_LINE = re.compile(r"Test accuracy (\S+) of (\S+) .*: (\d+) records of --test_data")
RUNNING_STATISTICS = ("running_mean", "running_var", "num_batches_tracked")
# The test DB's labels: a model that always answers class k scores a different accuracy for each
# k; the second of 2 processes scores the odd records (data/order.py), mostly class 3.
TEST_LABELS = [0, 3, 0, 3, 0, 3, 0, 3, 1, 0, 2, 1]


def labelled_test_db(path: str, labels, *more_records) -> str:
    """A test DB of JPEG Datum records with these labels, in key order, then `more_records`."""
    records = [
        (caffe_key(i, f"img{i}.jpg"), datum_record(label, encoded=make_jpeg(40, 48, seed=i)))
        for i, label in enumerate(labels)
    ]
    return write_db(path, "lmdb", [*records, *more_records])


@pytest.fixture(scope="module")
def trained(module_tmp_path):
    """One epoch (2 processes) with a test DB of the 12 TEST_LABELS and an unreadable record; its
    directory holds the run log and the checkpoint resnet50_model_1.pt."""
    root = module_tmp_path
    train = write_image_db(str(root / "train"), 16, 4)
    unreadable = caffe_key(len(TEST_LABELS), "unreadable.jpg"), datum_record(0, encoded=b"no JPEG")
    test = labelled_test_db(str(root / "test"), TEST_LABELS, unreadable)
    out = root / "run"
    done = run_trainer(
        "--train_data", train, "--test_data", test, "--num_gpus", "2", "--num_epochs", "1",
        "--log_dir", str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return train, test, out


# Each process's test batches of 4, as in the training run, so every image is scored in a batch
# of the same shape.
@pytest.mark.parametrize(("processes", "batch_size"), [("1", "4"), ("2", "8")])
def test_test_only_gives_the_accuracy_the_run_logged(trained, tmp_path, processes, batch_size):
    """On 1 or 2 processes: the epoch's logged test accuracy over every readable test record, the
    unreadable one counted; no file written anywhere, no training DB nor a writable --log_dir
    needed, and neither another run's checkpoints in --checkpoint_dir nor its live lock on them
    stand in the way."""
    _, test, out = trained
    _, _, rows = read_log(out)
    before = files(out)
    not_a_directory = tmp_path / "a_file"
    not_a_directory.write_text("")
    held = lock_checkpoints(str(out), "resnet50_model")  # as a live run in that directory holds it
    try:
        done = run_trainer(
            "--train_data", str(tmp_path / "no_training_db"), "--test_data", test, "--test_only",
            "--num_gpus", processes, "--batch_size", batch_size,
            "--load_model_path", str(out), "--checkpoint_dir", str(out),
            "--log_dir", str(not_a_directory),
        )  # fmt: skip
    finally:
        held.release()
    assert done.returncode == 0, done.stderr
    found = ACCURACY_LINE.search(done.stderr)
    assert found, done.stderr
    accuracy, path, records = found.groups()
    assert float(accuracy) == float(rows[-1]["test_accuracy"]), done.stderr
    assert path == str(out / "resnet50_model_1.pt") and records == "12"
    assert "(unreadable records left out: 1)" in done.stderr
    assert files(out) == before and os.listdir(tmp_path) == ["a_file"]
    assert "Nothing to train" not in done.stderr and "Epoch" not in done.stderr


def test_test_only_scores_the_files_weights_on_every_process(trained, tmp_path):
    """A checkpoint whose classifier always answers class 3 scores class 3's share of the test DB
    on 2 processes: the second process, whose share is mostly class 3, scores with the weights
    the first read from the file (with its own, it would score a class it guessed)."""
    train, test, out = trained
    state = torch.load(out / "resnet50_model_1.pt", weights_only=True)
    state["model"]["fc.weight"].zero_()
    state["model"]["fc.bias"].copy_(torch.tensor([0.0, 0.0, 0.0, 1.0]))
    always_three = tmp_path / "always_three.pt"
    torch.save(state, always_three)
    done = run_trainer(
        "--train_data", train, "--test_data", test, "--test_only", "--num_gpus", "2",
        "--load_model_path", str(always_three), "--log_dir", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found = ACCURACY_LINE.search(done.stderr)
    assert found, done.stderr
    accuracy, _, records = found.groups()
    assert float(accuracy) == round(TEST_LABELS.count(3) / len(TEST_LABELS), 6)
    assert records == "12" and os.listdir(tmp_path) == ["always_three.pt"]


def test_a_stop_signal_ends_test_only_at_the_next_batch(trained, tmp_path):
    """SIGTERM to the run's process group (as Slurm preempts a job) after the first process's
    first test batch of 6: every process stops before its next batch, exit 3 with one line
    naming the signal, nothing written; without the stop, the whole DB would be scored."""
    _, _, out = trained
    test = labelled_test_db(str(tmp_path / "test"), TEST_LABELS * 4)
    before = files(out)
    run = start_trainer(
        "--train_data", str(tmp_path / "no_training_db"), "--test_data", test, "--test_only",
        "--num_gpus", "2", "--batch_size", "8", "--load_model_path", str(out),
        "--log_dir", str(tmp_path / "log"),
        PYTHONPATH=f"{REPOSITORY}:{HOOKS}",
        RESNET50_TRAINER_TEST_SIGNAL_AFTER_TEST_BATCHES="1:SIGTERM:0:group",
    )  # fmt: skip
    _, stderr = run.communicate(timeout=RUN_TIMEOUT_S)
    assert run.returncode == PREEMPTED_EXIT_STATUS, stderr
    assert re.search(
        r"error: stopped by SIGTERM before the evaluation of \S+ ended: nothing was written; "
        "run the same command again to score it$",
        one_error_line(stderr),
    )
    assert not ACCURACY_LINE.search(stderr)
    assert files(out) == before and os.listdir(tmp_path) == ["test"]


def test_init_model_with_new_labels_starts_from_the_files_weights(image_db, tmp_path):
    """A 4-label run from our checkpoint of a 10-label run and from a torchvision resnet18 state
    dict of 1000 classes: fc replaced, said once; with an LR too small to move a float32 weight,
    the run's first checkpoint has every parameter but fc's exactly the file's; a fresh run:
    epoch 1, iteration 1, a lineage of its own."""
    ten = run_trainer(
        "--train_data", image_db("ten", 8, 10), "--num_labels", "10", "--num_epochs", "1",
        "--log_dir", str(tmp_path / "ten_run"),
    )  # fmt: skip
    assert ten.returncode == 0, ten.stderr
    ours = tmp_path / "ten_run" / "resnet50_model_1.pt"
    torchvision_file = tmp_path / "resnet18.pth"
    torch.manual_seed(1)
    torch.save(models.resnet18(num_classes=1000).state_dict(), torchvision_file)
    train = image_db("four", 8, 4)
    for source, classes in ((ours, 10), (torchvision_file, 1000)):
        run_dir = tmp_path / f"from_{source.stem}"
        done = run_trainer(
            "--train_data", train, "--init_model", str(source), "--num_epochs", "1",
            "--base_learning_rate", "1e-300", "--weight_decay", "0", "--log_dir", str(run_dir),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        replaced = f"its classifier has {classes} classes, this run's 4: fc is replaced"
        assert done.stderr.count(replaced) == 1, done.stderr
        start = torch.load(source, map_location="cpu", weights_only=True)
        start = start.get("model", start)
        saved = torch.load(run_dir / "resnet50_model_1.pt", map_location="cpu", weights_only=True)
        assert (saved["epoch"], saved["iteration"]) == (1, 1)
        assert saved["lineage"] != torch.load(ours, weights_only=True)["lineage"]
        assert saved["model"]["fc.weight"].shape == (4, 512)
        for name, tensor in saved["model"].items():
            if not name.startswith("fc.") and not name.endswith(RUNNING_STATISTICS):
                assert torch.equal(tensor, start[name]), name


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--test_only", "--test_data", "t"], "give --load_model_path (the checkpoint"),
        (["--test_only", "--load_model_path", "c"], "give --test_data (the checkpoint"),
        (["--test_only"], "give --load_model_path and --test_data"),
        (["--init_model", "w", "--load_model_path", "c"], "give one of them"),
    ],
)
def test_flags_that_do_not_go_together(capsys, flags, expected):
    line = refused_in_process(capsys, "--train_data", "missing", *flags)
    assert expected in line


def test_test_only_refuses_bad_input(capsys, trained, image_db, tmp_path):
    """Another --num_labels than the checkpoint's, a checkpoint path that is not there, an empty
    test DB: one line each, and nothing written."""
    train, test, out = trained
    before = files(out)
    common = ("--train_data", train, "--test_only")
    cases = [
        (
            ["--test_data", image_db("t10", 10, 10), "--num_labels", "10", "--load_model_path",
             str(out)],
            "was made with --num_labels 4, this run has 10",
        ),
        (
            ["--test_data", test, "--load_model_path", str(tmp_path / "none.pt")],
            "--load_model_path " + str(tmp_path / "none.pt") + " does not exist",
        ),
        (
            ["--test_data", write_db(str(tmp_path / "empty"), "lmdb", []), "--load_model_path",
             str(out)],
            "holds no records",
        ),
    ]  # fmt: skip
    for flags, expected in cases:
        assert expected in refused_in_process(capsys, *common, *flags, "--log_dir", str(tmp_path))
    assert files(out) == before


def test_init_model_refuses_what_is_no_fitting_weights(capsys, image_db, tmp_path):
    """A random file, a FIFO, a device, a directory, a Caffe2 .mdl file, a NaN weight, another
    depth, another channel count: one line naming the file and the fix, before anything is
    written."""
    train = image_db("train", 8, 4)
    random_file = tmp_path / "random.pt"
    random_file.write_bytes(os.urandom(4096))
    mdl = tmp_path / "resnet50.mdl"
    mdl.write_bytes(b"\n\x0bresnet50_init\x12\x05gpu_0" + os.urandom(256))  # protobuf-like
    nan_weights = models.resnet18(num_classes=4).state_dict()
    nan_weights["layer1.0.conv1.weight"][0, 0, 0, 0] = float("nan")
    torch.save(nan_weights, tmp_path / "nan.pth")
    torch.save(models.resnet34(num_classes=4).state_dict(), tmp_path / "resnet34.pth")
    torch.save(models.resnet18(num_classes=4).state_dict(), tmp_path / "rgb.pth")
    os.mkfifo(tmp_path / "fifo.pt")  # no writer: reading it would block forever
    out = tmp_path / "out"
    cases = [
        (random_file, [], "is not a PyTorch weights file"),
        (tmp_path / "fifo.pt", [], "is not a regular file"),
        (Path("/dev/zero"), [], "is not a regular file"),
        (tmp_path, [], "is a directory: give one of our .pt checkpoints"),
        (mdl, [], "(Caffe2 .mdl files are not read)"),
        (tmp_path / "nan.pth", [], "has non-finite values in layer1.0.conv1.weight"),
        (tmp_path / "resnet34.pth", [], "unknown to this model: give weights of a ResNet-18"),
        (
            tmp_path / "rgb.pth",
            ["--num_channels", "1"],
            "conv1.weight of shape (64, 3, 7, 7), this model's is (64, 1, 7, 7)",
        ),
    ]
    for path, flags, expected in cases:
        line = refused_in_process(
            capsys, "--train_data", train, "--init_model", str(path), "--log_dir", str(out), *flags
        )
        assert f"--init_model {path} " in line and expected in line, line
    assert not out.exists()  # the refusal comes before its folders are made


@pytest.mark.parametrize(
    "labels, expected",
    [
        (
            (0, 1, 2, 5),
            "holds label 5, outside 0..3: use a test DB of this model's 4 classes, "
            "or a model of 6 or more (--num_labels)",
        ),
        ((0, -1, 2, 3), "holds label -1, outside 0..3: use a test DB of this model's 4 classes"),
    ],
    ids=["above", "negative"],
)
@pytest.mark.parametrize("test_only", [False, True], ids=["training", "test_only"])
def test_test_labels_preflight_had_no_time_for_stop_the_run_at_the_first_test(
    capfd, caplog, monkeypatch, trained, image_db, tmp_path, labels, expected, test_only
):
    """Preflight checks test labels for LABEL_SCAN_S seconds (a cold ImageNet test DB would take
    minutes); given none, it checks no record, and the first test (after an epoch, or of
    --test_only) finds the label out of range on the second process: both stop there, one line,
    exit 2, the epoch's checkpoint kept."""
    from resnet50_trainer import cli
    from resnet50_trainer.launch import preflight

    monkeypatch.setattr(preflight, "LABEL_SCAN_S", 0.0)
    caplog.set_level(logging.INFO, "resnet50_trainer.launch.preflight")
    # The second process reads records 1, 3, ...
    test = labelled_test_db(str(tmp_path / "test"), labels * 2)
    out = tmp_path / "out"
    if test_only:
        run = ["--train_data", trained[0], "--test_only", "--load_model_path", str(trained[2])]
    else:
        run = ["--train_data", image_db("train", 16, 4), "--num_epochs", "1"]
    status = cli.main(
        [*SMALL_RUN, *run, "--test_data", test, "--num_gpus", "2", "--log_dir", str(out)]
    )
    error = capfd.readouterr().err
    assert status == 2, error
    assert "Test labels: those of the first 0 records checked in 0.0 s" in caplog.text
    lines = [line for line in error.splitlines() if line.startswith("resnet50-trainer: error:")]
    assert lines == [f"resnet50-trainer: error: --test_data {test} {expected}"], error
    assert "Traceback" not in error
    assert test_only or (out / "resnet50_model_1.pt").is_file()
