"""--dtype, --float16_compute, --enable_tensor_core and --decode_device on a CPU-only machine:
bfloat16 trains; the GPU-only flags refuse in one line with exit status 2."""

from __future__ import annotations

import dataclasses
import glob
import math
import os

import pytest
import torch

from resnet50_trainer import cli
from resnet50_trainer.checkpoint import files as checkpoint_files
from resnet50_trainer.model.precision import (
    Precision,
    PrecisionSettings,
    compute_dtype,
    normalize,
)
from trainer_runs import SMALL_RUN, config_of

TINY = [*SMALL_RUN, "--num_epochs", "1"]


def tiny_config(*flags: str):
    return config_of("--train_data", "null", *TINY, *flags)


def test_bfloat16_run_on_cpu_trains_and_logs(image_db, tmp_path):
    db = image_db("train", 16, 4)
    status = cli.main(
        [
            "--train_data",
            db,
            "--test_data",
            image_db("test", 8, 4),
            "--dtype",
            "bfloat16",
            "--log_dir",
            str(tmp_path),
            *TINY,
        ]
    )
    assert status == 0
    [log_path] = glob.glob(str(tmp_path / "resnet50_gpu1_b8_L4_*.log"))
    with open(log_path) as log_file:
        row = log_file.read().splitlines()[2].split(",")
    assert int(row[2]) == 16 and math.isfinite(float(row[9]))  # input_count, loss
    saved = checkpoint_files.load_checkpoint(
        os.path.join(tmp_path, "resnet50_model_1.pt"), "resnet50_model"
    )
    assert saved["arguments"]["dtype"] == "bfloat16"
    assert saved["model"]["fc.weight"].dtype == torch.float32  # autocast keeps float32 weights
    assert saved["scaler"] == {}  # no scaler without float16


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--dtype", "float16"], "--dtype float16"),
        (["--float16_compute"], "--float16_compute"),
        (["--enable_tensor_core"], "--enable_tensor_core"),
        (["--decode_device", "gpu"], "--decode_device gpu"),
    ],
)
def test_gpu_only_flags_refuse_on_cpu_in_one_line(image_db, tmp_path, capsys, flags, named):
    db = image_db("train", 8, 4)
    logs = tmp_path / "logs"
    assert cli.main(["--train_data", db, "--log_dir", str(logs), *TINY, *flags]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and named in error and "--use_cpu" in error
    assert not logs.exists()  # refused before any work


def test_contradictory_precision_and_pointless_gpu_decode_refuse(capsys):
    without_use_cpu = [flag for flag in TINY if flag != "--use_cpu"]
    for flags in (["--float16_compute", "--dtype", "bfloat16"], ["--decode_device", "gpu"]):
        assert cli.main(["--train_data", "null", *without_use_cpu, *flags]) == 2
        assert capsys.readouterr().err.count("\n") == 1


def test_compute_dtypes():
    assert compute_dtype(PrecisionSettings.of(tiny_config())) is None
    assert compute_dtype(PrecisionSettings.of(tiny_config("--dtype", "bfloat16"))) is torch.bfloat16
    # GPU-only, so refused here by the command line; the mapping itself is device-free.
    fp16_compute = dataclasses.replace(tiny_config(), float16_compute=True)
    assert (
        compute_dtype(PrecisionSettings.of(fp16_compute)) is torch.float16
    )  # the same mode as --dtype float16


def test_precision_inputs_dtype_layout_and_scaler():
    bf16 = Precision(PrecisionSettings.of(tiny_config("--dtype", "bfloat16")), torch.device("cpu"))
    images = torch.randint(0, 256, (2, 3, 8, 8), dtype=torch.uint8)
    prepared = bf16.inputs(images)
    assert prepared.dtype == torch.bfloat16
    assert torch.equal(prepared.float(), normalize(images))  # exact in bfloat16
    assert not bf16.scaler.is_enabled()
    with bf16.autocast():
        assert torch.nn.Linear(4, 2)(torch.ones(1, 4)).dtype == torch.bfloat16
    plain = Precision(PrecisionSettings.of(tiny_config()), torch.device("cpu"))
    with plain.autocast():
        assert torch.nn.Linear(4, 2)(torch.ones(1, 4)).dtype == torch.float32
