"""resnet50-export: a trained checkpoint as ONNX (run here by onnxruntime) and TorchScript, any
batch size, agreeing with PyTorch within 1e-4 on the DB's images, its preprocessing in the file's
metadata and in one printed line; bad input is one line and exit 2, and an existing output is
never left half-written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from resnet50_trainer.checkpoint import schema
from resnet50_trainer.model.resnet import build_model
from resnet50_trainer.tools.export.check import check_inputs
from resnet50_trainer.tools.export.command import main as export_main
from resnet50_trainer.tools.export.formats import PREPROCESSING_FILE
from resnet50_trainer.tools.export.network import read_network
from tests.support.dbfactory import cut_short, write_db, write_image_db
from tests.support.trainer_runs import imported_by, in_process, run_trainer, trainer_env

EXPECTED_LINE = (
    "Preprocessing: shorter side resized to 37, centre crop 32x32, RGB, pixels 0..255, "
    "NCHW float32, x = (pixel - mean) / std, mean [104, 117, 124], std [58, 57, 59]"
)


def export(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "resnet50_trainer.tools.export", *args],
        capture_output=True,
        text=True,
        env=trainer_env(),
        timeout=240,
    )


@pytest.fixture(scope="module")
def trained(module_tmp_path):
    """A ResNet-18 checkpoint with an EMA, and its DB; per-channel statistics in BGR order."""
    db = write_image_db(str(module_tmp_path / "db"), 16, 4)
    done = run_trainer(
        *("--train_data", db, "--num_epochs", "1", "--ema_decay", "0.5"),
        *("--image_mean_per_channel", "124,117,104", "--image_std_per_channel", "59,57,58"),
        *("--log_dir", str(module_tmp_path)),
    )
    assert done.returncode == 0, done.stderr
    return str(module_tmp_path / "resnet50_model_1.pt"), db


def pytorch_logits(checkpoint: str, images: torch.Tensor, ema: bool = False) -> np.ndarray:
    """The checkpoint's network built here from its weights, independently of the command."""
    state = torch.load(checkpoint, weights_only=True)
    model = build_model(18, 4, 3)
    model.load_state_dict(schema.ema_weights(state) if ema else state["model"])
    with torch.no_grad():
        return model.eval()(images).numpy()


def test_onnx_agrees_with_pytorch_at_any_batch_size_and_holds_its_preprocessing(trained, tmp_path):
    checkpoint, db = trained
    output = str(tmp_path / "model.onnx")
    done = export(checkpoint, "-o", output, "--check_data", db)
    assert done.returncode == 0, done.stderr
    assert "Checked on 16 images of" in done.stdout and EXPECTED_LINE in done.stdout
    images, _ = check_inputs(read_network(checkpoint, ema=False), db, 16)
    session = onnxruntime.InferenceSession(output, providers=["CPUExecutionProvider"])
    ((batch_dim, *_),) = [input.shape for input in session.get_inputs()]
    assert isinstance(batch_dim, str)  # symbolic: any batch size
    for size in (1, 3, 16):
        (logits,) = session.run(None, {"images": images[:size].numpy()})
        assert np.abs(logits - pytorch_logits(checkpoint, images[:size])).max() <= 1e-4
    metadata = {entry.key: json.loads(entry.value) for entry in onnx.load(output).metadata_props}
    assert metadata["resize_shorter_side"] == 37 and metadata["centre_crop"] == 32
    assert metadata["channel_order"] == "RGB"
    assert (metadata["mean"], metadata["std"]) == ([104, 117, 124], [58, 57, 59])
    assert oct(os.stat(output).st_mode & 0o777) == oct(0o666 & ~_umask())


@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")
def test_torchscript_of_the_ema_weights(trained, tmp_path):
    checkpoint, db = trained
    output = str(tmp_path / "model.ts")
    done = export(checkpoint, "-o", output, "--ema", "--check_data", db, "--check_images", "5")
    assert done.returncode == 0, done.stderr
    assert "EMA weights" in done.stdout
    extra = {PREPROCESSING_FILE: ""}
    model = torch.jit.load(output, _extra_files=extra)
    images, _ = check_inputs(read_network(checkpoint, ema=True), db, 5)
    with torch.no_grad():
        logits = model(images).numpy()
    assert np.abs(logits - pytorch_logits(checkpoint, images, ema=True)).max() <= 1e-4
    assert np.abs(logits - pytorch_logits(checkpoint, images)).max() > 1e-4  # not the weights
    assert json.loads(json.loads(extra[PREPROCESSING_FILE])["centre_crop"]) == 32


def test_a_resnext_of_another_depth(tmp_path):
    db = write_image_db(str(tmp_path / "db"), 16, 4)
    done = run_trainer(
        *("--train_data", db, "--num_epochs", "1", "--num_layers", "50"),
        *("--resnext_num_groups", "2", "--resnext_width_per_group", "4"),
        *("--log_dir", str(tmp_path)),
    )
    assert done.returncode == 0, done.stderr
    output = str(tmp_path / "resnext.onnx")
    done = export(str(tmp_path / "resnet50_model_1.pt"), "-o", output, "--check_data", db)
    assert done.returncode == 0, done.stderr
    assert "ResNeXt-50, 4 labels" in done.stdout


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# A checkpoint's saved arguments altered: (value, as the refusal quotes it). Checked as the
# trainer's flags are (a num_labels in range that does not fit the weights: its own case).
ALTERED = {
    "image_size": ("abc", "'abc'"),
    "test_image_size": (-5, "'-5'"),
    "num_layers": (49, "'49'"),
    "image_mean_per_channel": (["a", "b", "c"], "'a,b,c'"),
    "image_std_per_channel": ([0, 0, 0], "'0,0,0'"),
}


@pytest.mark.parametrize(
    "case, expected",
    [
        ("a DB", "is not a regular file"),
        ("a text file", "is not a readable checkpoint"),
        ("a damaged checkpoint", "is not a readable checkpoint"),
        ("no EMA", "holds none (its run had no --ema_decay): leave --ema out"),
        ("a directory under a file", "model.onnx is a file, not a folder"),
        ("an unknown suffix", "names no format"),
        ("the checkpoint itself", "is the checkpoint itself"),
        ("a DB of no images", "records are no image this network reads (the first: 00000000)"),
        ("a DB cut short", "is incomplete: its data.mdb is"),
        *[
            (f"altered {name}", f"holds --{name} {text}, which resnet50-trainer refuses")
            for name, (_, text) in ALTERED.items()
        ],
        ("altered num_labels", "holds --num_labels 1000000 and weights for 4"),
    ],
)
def test_bad_input_is_one_line_and_leaves_the_output_as_it_was(
    trained, tmp_path, capsys, case, expected
):
    """In this process but for a DB cut short, whose read past data.mdb's end would be a SIGBUS
    where our check failed: a process of its own."""
    checkpoint, db = trained
    output = tmp_path / "model.onnx"
    output.write_bytes(b"an earlier export")
    args = [checkpoint, "-o", str(output)]
    if case == "a DB":
        args[0] = db
    elif case == "a DB of no images":
        records = [(b"%08d" % i, b"\x08\x01not an image %d" % i) for i in range(4)]
        args += ["--check_data", write_db(str(tmp_path / "garbage"), "lmdb", records)]
    elif case.startswith("altered "):
        name = case.removeprefix("altered ")
        state = torch.load(checkpoint, weights_only=True)
        state["arguments"][name] = ALTERED[name][0] if name in ALTERED else 1_000_000
        torch.save(state, tmp_path / "altered.pt")
        args[0] = str(tmp_path / "altered.pt")
    elif case == "a DB cut short":  # a page past data.mdb's end: SIGBUS, exit 135, nothing said
        args += ["--check_data", cut_short(write_image_db(str(tmp_path / "cut"), 40, 4))]
    elif case == "a text file":
        args[0] = str(tmp_path / "notes.pt")
        (tmp_path / "notes.pt").write_text("not a checkpoint")
    elif case == "a damaged checkpoint":
        args[0] = str(tmp_path / "cut.pt")
        (tmp_path / "cut.pt").write_bytes(Path(checkpoint).read_bytes()[:100_000])
    elif case == "no EMA":
        state = torch.load(checkpoint, weights_only=True)
        state["ema"] = None
        torch.save(state, tmp_path / "plain.pt")
        args[0] = str(tmp_path / "plain.pt")
        args.append("--ema")
    elif case == "a directory under a file":
        args[2] = str(output / "model.onnx")
    elif case == "an unknown suffix":
        args[2] = str(tmp_path / "model.bin")
    elif case == "the checkpoint itself":
        args[0] = str(tmp_path / "model.pt")
        args[2] = str(tmp_path / "model.pt")
        output = tmp_path / "model.pt"
        output.write_bytes(b"an earlier export")
    status: object
    if case == "a DB cut short":
        done = export(*args)
        status, stderr = done.returncode, done.stderr
    else:
        status, stderr = in_process(capsys, export_main, *args)
    assert status == 2, stderr
    (line,) = stderr.splitlines()
    assert line.startswith("resnet50-export: error: ") and expected in line, line
    assert output.read_bytes() == b"an earlier export"
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".partial")]


def test_an_output_that_is_a_link_is_written_through(trained, tmp_path, capsys):
    """The link stays and the file it names holds the export (the link was replaced by a file
    and its target kept the old contents)."""
    checkpoint, _ = trained
    target = tmp_path / "model.pt"
    target.write_bytes(b"an earlier export")
    link = tmp_path / "link.pt"
    link.symlink_to(target)
    status, stderr = in_process(capsys, export_main, checkpoint, "-o", str(link))
    assert status == 0, stderr
    assert link.is_symlink() and target.read_bytes()[:2] == b"PK"  # TorchScript: a zip archive
    assert sorted(os.listdir(tmp_path)) == ["link.pt", "model.pt"]


def test_an_export_into_a_folder_whose_name_is_not_utf8_is_written(trained, tmp_path, capsys):
    """torch.jit.load took the path as UTF-8: a TypeError traceback where it held byte 0xff."""
    checkpoint, _ = trained
    folder = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"\xff"))
    os.mkdir(folder)
    output = os.path.join(folder, "model.pt")
    status, stderr = in_process(capsys, export_main, checkpoint, "-o", output)
    assert status == 0, stderr
    assert os.listdir(folder) == ["model.pt"]


def test_an_export_past_the_tolerance_is_refused_and_nothing_replaced(trained, tmp_path):
    checkpoint, db = trained
    output = tmp_path / "model.onnx"
    output.write_bytes(b"an earlier export")
    done = export(checkpoint, "-o", str(output), "--check_data", db, "--tolerance", "1e-12")
    assert done.returncode == 1, done.stderr
    assert "above --tolerance 1e-12: nothing written to" in done.stderr
    assert output.read_bytes() == b"an earlier export"
    assert os.listdir(tmp_path) == ["model.onnx"]  # no temporary file left


def test_help_version_and_refusals_do_not_import_torch():
    argvs = [["--help"], ["--version"], ["x.pt", "-o", "model.bin"], ["x.pt"]]
    assert imported_by("resnet50_trainer.tools.export.command", argvs, ("torch",)) == []


@pytest.mark.parametrize(
    "module, prog",
    [
        ("resnet50_trainer", "resnet50-trainer"),
        ("resnet50_trainer.tools.db", "resnet50-db"),
        ("resnet50_trainer.tools.plot", "resnet50-plot"),
        ("resnet50_trainer.tools.export", "resnet50-export"),
    ],
)
def test_every_command_has_python_m_and_a_version(module, prog):
    done = subprocess.run(
        [sys.executable, "-m", module, "--version"],
        capture_output=True,
        text=True,
        env=trainer_env(),
        timeout=60,
    )
    from resnet50_trainer import __version__

    assert (done.returncode, done.stdout) == (0, f"{prog} {__version__}\n"), done.stderr


@pytest.mark.parametrize("suffix", [".pt", ".onnx"])
def test_a_full_disk_is_one_line_and_leaves_no_temporary_file(trained, tmpfs, suffix):
    """A 2 MB disk holds no ResNet-18 (45 MB): one line naming the output and the reason, exit
    2 (torch's C++ writer aborted the process with exit 134), nothing left on the disk."""
    checkpoint, _ = trained
    disk = tmpfs("disk", "2m")
    done = export(checkpoint, "-o", os.path.join(disk, "model" + suffix))
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert "cannot be written (No space left on device)" in line, line
    assert os.listdir(disk) == []
