"""The GPU data paths: the decode (its stream hand-over, its fallbacks, which errors count as bad
records), the progress bar's loss without host syncs, the NVML monitor and the profiler on CUDA.

The logic runs here with the CPU as the decode device where torchvision allows it; the tests marked
`gpu` (tests/support/gpu.py) need CUDA and are skipped with a reason without it."""

from __future__ import annotations

import contextlib
import glob
import gzip
import io
import json
import os
import subprocess
import sys
import threading

import pytest
import torch
from PIL import Image

from resnet50_trainer.data.cpu_decode import CpuDecode
from resnet50_trainer.data.dataset import ImageRecords
from resnet50_trainer.data.formats.databases import read_keys
from resnet50_trainer.data.gpu_decode import BatchDecoder, GpuDecode, raise_unless_record_failure
from resnet50_trainer.data.input_pipeline import make_loader
from resnet50_trainer.data.settings import InputSettings
from resnet50_trainer.reporting.progress import EpochProgress, LossReader
from tests.support.dbfactory import (
    datum_record,
    encode_image,
    make_jpeg,
    make_undecodable_jpeg,
    smooth_pixels,
    write_db,
)
from tests.support.gpu import gpu_marks, needs_gpu, needs_two_gpus
from tests.support.trainer_runs import RUN_TIMEOUT_S, SMALL_RUN, config_of, read_log, trainer_env

CPU = torch.device("cpu")
DEVICES = [CPU, pytest.param(torch.device("cuda"), marks=gpu_marks(1))]


def jpeg_of(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", **options)
    return buffer.getvalue()


def first_batch(decoding, db: str, count: int, train: bool = True):
    settings = InputSettings(
        num_labels=4,
        num_channels=3,
        scale=40,
        image_size=32,
        seed=7,
        num_workers=0,
        decode_on_gpu=decoding is GpuDecode,
    )
    records = ImageRecords(db, "lmdb", read_keys(db, "lmdb"), settings, train, decoding(settings))
    items = [[(p, p) for p in range(count)]] if train else [list(range(count))]
    return next(iter(make_loader(records, items, 0, False)))


def db_of_every_kind(tmp_path) -> str:
    """Records 0-2 go to the device (baseline, gray, progressive JPEG), 3-5 to the CPU fallback
    (CMYK, PNG, raw pixels), 6 is cut short (the CPU path judges it: bad), 7 fails to decode."""
    picture = Image.fromarray(smooth_pixels(48, 56, seed=4))
    cut = jpeg_of(picture)
    kinds = [
        datum_record(0, encoded=jpeg_of(picture)),
        datum_record(1, encoded=jpeg_of(picture.convert("L"))),
        datum_record(2, encoded=jpeg_of(picture, progressive=True)),
        datum_record(3, encoded=jpeg_of(picture.convert("CMYK"))),
        datum_record(0, encoded=encode_image(smooth_pixels(48, 56, seed=5), "PNG")),
        datum_record(1, pixels=smooth_pixels(48, 56, seed=6)),
        datum_record(2, encoded=cut[: len(cut) * 3 // 5]),
        datum_record(3, encoded=make_undecodable_jpeg()),
    ]
    return write_db(str(tmp_path / "db"), "lmdb", [(b"%d" % i, r) for i, r in enumerate(kinds)])


@pytest.mark.parametrize("device", DEVICES, ids=str)
def test_every_kind_of_record_decodes_as_on_the_cpu_path_and_bad_ones_are_named(tmp_path, device):
    db = db_of_every_kind(tmp_path)
    cpu = first_batch(CpuDecode, db, 8)
    encoded = first_batch(GpuDecode, db, 8)
    assert [span is None for span in encoded.spans] == [False] * 3 + [True] * 3 + [False]
    decoded = BatchDecoder(device, 3, 32)(encoded)
    assert decoded.bad_keys == cpu.bad_keys == [b"6", b"7"]
    assert decoded.labels.tolist() == cpu.labels.tolist() == [0, 1, 2, 3, 0, 1, 0, 1]
    difference = (decoded.images.cpu().float() - cpu.images.float()).abs()
    if device.type == "cpu":  # the same decoder (libjpeg-turbo) and the same resize
        assert torch.equal(decoded.images, cpu.images)
    else:  # nvJPEG's IDCT and upsampling differ from libjpeg-turbo's by a level or two
        assert difference.mean(dim=(1, 2, 3)).max() < 3


def test_a_batch_travels_as_one_tensor_of_file_bytes(tmp_path):
    files = [make_jpeg(40 + i, 50, seed=i) for i in range(4)]
    db = write_db(
        str(tmp_path / "db"),
        "lmdb",
        [(b"%d" % i, datum_record(i, encoded=f)) for i, f in enumerate(files)],
    )
    encoded = first_batch(GpuDecode, db, 4)
    assert [bytes(encoded.encoded[start:end]) for start, end in encoded.spans] == files


def test_crops_of_one_size_resized_together_equal_the_cpu_paths(tmp_path):
    """Same-sized images under the scale crop share a box size: one resize for the batch, the
    mirrored ones flipped in it; the pixels are still the CPU path's."""
    db = write_db(
        str(tmp_path / "db"),
        "lmdb",
        [(b"%d" % i, datum_record(i % 4, encoded=make_jpeg(50, 60, seed=i))) for i in range(8)],
    )
    cpu, encoded = first_batch(CpuDecode, db, 8), first_batch(GpuDecode, db, 8)
    assert len({plan.mirror for plan in encoded.plans}) == 2  # both kinds in the one group
    decoded = BatchDecoder(CPU, 3, 32)(encoded)
    assert torch.equal(decoded.images, cpu.images) and torch.equal(decoded.labels, cpu.labels)


@pytest.mark.parametrize(
    "error",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        RuntimeError("CUDA error: an illegal memory access was encountered"),
        RuntimeError("decode_jpegs_cuda: torchvision not compiled with nvJPEG support"),
        RuntimeError("called a synchronizing CUDA operation"),  # set_sync_debug_mode("error")
    ],
    ids=["out_of_memory", "cuda_error", "no_nvjpeg", "sync_debug_mode"],
)
def test_device_failures_stop_the_run_instead_of_counting_as_bad_records(error):
    with pytest.raises(type(error)):
        raise_unless_record_failure(error)


def test_a_records_own_decode_error_is_counted():
    raise_unless_record_failure(RuntimeError("Quantization table 0x03 was not defined"))


def test_the_loss_reader_reads_a_cpu_loss_at_once():
    assert LossReader().read(torch.tensor(0.25)) == 0.25


@needs_gpu
def test_the_nvjpeg_probe_passes_where_nvjpeg_runs():
    BatchDecoder(torch.device("cuda"), 3, 32)


@needs_gpu
def test_the_decodes_wait_by_design_passes_sync_debug_mode_and_leaves_it_set(tmp_path):
    """The GPU decode waits for the device once a batch (vision PR #9606): under
    set_sync_debug_mode("error") it decodes a batch with a record nvJPEG fails on (decoded again
    one at a time, its place filled, the labels reordered), and the mode is still "error"."""
    jpegs = [make_jpeg(40, 50, seed=i) for i in range(4)] + [make_undecodable_jpeg()]
    db = write_db(
        str(tmp_path / "db"),
        "lmdb",
        [(b"%d" % i, datum_record(i % 4, encoded=jpeg)) for i, jpeg in enumerate(jpegs)],
    )
    decoder = BatchDecoder(torch.device("cuda"), 3, 32)
    encoded = first_batch(GpuDecode, db, 5)
    torch.cuda.set_sync_debug_mode("error")
    try:
        decoded = decoder(encoded)
        assert torch.cuda.get_sync_debug_mode() == 2  # "error"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert decoded.bad_keys == [b"4"] and decoded.images.shape == (5, 3, 32, 32)
    assert decoded.labels.tolist() == [0, 1, 2, 3, 0]


@needs_gpu
def test_decoding_on_a_busy_side_stream_leaves_queued_work_and_crops_intact(tmp_path):
    """pytorch/vision PR #9606: the decoder must not be handed memory that kernels queued on the
    calling stream still read. Each round frees tensors whose sums are queued behind a long sleep,
    then decodes on that stream; both the sums and the crops must come out exact, 50 times."""
    db = write_db(
        str(tmp_path / "db"),
        "lmdb",
        [(b"%d" % i, datum_record(i % 4, encoded=make_jpeg(160, 200, seed=i))) for i in range(16)],
    )
    encoded = first_batch(GpuDecode, db, 16, train=False)
    decoder = BatchDecoder(torch.device("cuda"), 3, 32)
    reference = decoder(encoded).images.clone()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    size = 3 * 160 * 200 // 4  # float32 tensors the size of a decoded image
    expected = torch.arange(16, dtype=torch.float32, device="cuda") * size
    bad_sums = bad_crops = 0
    for _ in range(50):
        with torch.cuda.stream(side):
            victims = [torch.full((size,), float(n), device="cuda") for n in range(16)]
            side.synchronize()
            torch.cuda._sleep(20_000_000)  # tens of milliseconds of queued work
            sums = torch.stack([victim.sum() for victim in victims])
            del victims  # freed while their sums still wait behind the sleep
            images = decoder(encoded).images
        torch.cuda.synchronize()
        bad_sums += not torch.equal(sums, expected)
        bad_crops += not torch.equal(images, reference)
    assert (bad_sums, bad_crops) == (0, 0)


@contextlib.contextmanager
def stderr_on_a_terminal(monkeypatch):
    """sys.stderr on a real pseudo-terminal (drained by a thread), where tqdm shows its bar."""
    master, replica = os.openpty()
    drain = threading.Thread(target=lambda: _read_until_closed(master), daemon=True)
    drain.start()
    with os.fdopen(replica, "w") as terminal:
        monkeypatch.setattr(sys, "stderr", terminal)
        yield
    drain.join(timeout=10)
    os.close(master)


def _read_until_closed(descriptor: int) -> None:
    with contextlib.suppress(OSError):  # EIO once the terminal's other side is closed
        while os.read(descriptor, 4096):
            pass


@needs_gpu
def test_the_progress_bar_never_syncs_the_host(monkeypatch):
    """20 steps after a warm-up under set_sync_debug_mode("error"), the bar refreshed every step."""
    clock = iter(range(0, 10_000, 2))  # 2 s a step: every step refreshes
    config = config_of("--train_data", "null", "--print_every", "1000", gpus_present=1)
    weights = torch.randn(256, device="cuda")
    with stderr_on_a_terminal(monkeypatch):
        progress = EpochProgress(config, True, 0, 1000, clock=lambda: float(next(clock)))
        assert not progress.bar.disable

        def steps(first: int, count: int) -> None:
            for step in range(first, first + count):
                loss = (weights * step).square().mean()
                progress.step(step, loss, loss, 8, bad_keys=[])

        steps(0, 5)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            steps(5, 20)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            progress.close()
    assert progress.loss_reader.value is not None


def run_on_gpu(*args: str, **env: str) -> subprocess.CompletedProcess:
    """The small run of tests/support/trainer_runs.py without --use_cpu."""
    run = [flag for flag in SMALL_RUN if flag != "--use_cpu"]
    return subprocess.run(
        [sys.executable, "-m", "resnet50_trainer", *run, *args],
        env=trainer_env(**env),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


@needs_gpu
def test_a_run_decoding_on_the_gpu_trains_and_evaluates(image_db, tmp_path):
    train, test = image_db("train", 48, 4), image_db("test", 16, 4)
    result = run_on_gpu(
        *("--train_data", train, "--test_data", test, "--decode_device", "gpu"),
        *("--num_epochs", "1", "--log_dir", str(tmp_path)),
    )
    assert result.returncode == 0, result.stderr
    assert "Skipped undecodable" not in result.stderr
    assert "Synchronization debug mode" not in result.stderr  # the decode's wait leaves it be


@needs_gpu
def test_profile_iters_on_cuda_traces_the_kernels_and_says_where_the_gpus_time_went(tmp_path):
    result = run_on_gpu(
        *("--train_data", "null", "--epoch_size", "64", "--num_epochs", "1"),
        *("--profile_iters", "2", "--log_dir", str(tmp_path)),
    )
    assert result.returncode == 0, result.stderr
    read_log(tmp_path)
    (trace,) = glob.glob(str(tmp_path / "*.trace.json.gz"))
    with gzip.open(trace, "rt") as file:
        events = json.load(file)["traceEvents"]
    assert any(event.get("cat") == "kernel" for event in events)
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("Profile of")]
    assert "ms a step: the GPU was busy " in line, line
    (table,) = glob.glob(str(tmp_path / "*.profile.md"))
    with open(table) as file:
        text = file.read()
    assert "| convolution | cuDNN |" in text and "| batch norm |" in text, text


@needs_two_gpus
def test_the_monitor_reads_the_training_gpu_when_cuda_renumbers_them():
    """Under CUDA_VISIBLE_DEVICES=1,0 CUDA's GPU 0 is NVML's GPU 1 (both in PCI order)."""
    source = (
        "import pynvml\n"
        "from resnet50_trainer.reporting.gpu_monitor import GpuMonitor\n"
        "monitor = GpuMonitor([0])\n"
        "assert monitor.enabled\n"
        "ours = pynvml.nvmlDeviceGetUUID(monitor._handles[0])\n"
        "print(ours == pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(1)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", source],
        env=trainer_env(CUDA_VISIBLE_DEVICES="1,0", CUDA_DEVICE_ORDER="PCI_BUS_ID"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == "True", result.stderr
