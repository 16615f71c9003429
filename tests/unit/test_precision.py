"""--dtype, --float16_compute, --enable_tensor_core and --decode_device on a CPU-only machine:
bfloat16 trains; the GPU-only flags refuse in one line with exit status 2."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from resnet50_trainer import cli
from resnet50_trainer.data.settings import InputSettings
from resnet50_trainer.model.precision import (
    Precision,
    PrecisionSettings,
    compute_dtype,
    describe_precision,
    normalize,
)
from tests.support.trainer_runs import SMALL_RUN, config_of

TINY = [*SMALL_RUN, "--num_epochs", "1"]


def tiny_config(*flags: str):
    return config_of("--train_data", "null", *TINY, *flags)


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


@pytest.mark.parametrize(
    "flags, device, words",
    [
        ((), "cpu", "float32 on the CPU"),
        (("--dtype", "bfloat16"), "cpu", "bfloat16 autocast on the CPU"),
        (
            ("--dtype", "float16", "--enable_tensor_core"),
            "cuda:1",
            "float16 autocast with a gradient scaler, channels_last and TF32 on cuda:1",
        ),
        (("--float16_compute",), "cuda:0", "float16 autocast with a gradient scaler on cuda:0"),
    ],
)
def test_the_start_line_says_the_arithmetic_the_layout_and_the_device(flags, device, words):
    config = config_of("--train_data", "null", *flags, gpus_present=2)
    assert describe_precision(PrecisionSettings.of(config), torch.device(device)) == words


@pytest.mark.parametrize(
    "workers, on_gpu, processes, words",
    [
        (0, False, 1, "images decoded by the training process"),
        (0, False, 2, "images decoded by the training processes"),
        (1, False, 1, "images decoded by 1 input process"),
        (2, False, 2, "images decoded by 2 input processes per training process"),
        (4, True, 1, "JPEGs decoded on the GPU (nvJPEG), read by 4 input processes"),
    ],
)
def test_the_start_line_says_where_images_are_decoded(workers, on_gpu, processes, words):
    settings = InputSettings(10, 3, 36, 32, 0, workers, on_gpu)
    assert settings.describe_decoding(processes) == words
