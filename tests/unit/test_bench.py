"""The input pipeline's parts: `resnet50-db bench`, the device prefetcher, and the GPU decode path's
logic (run here with the CPU as its device, which decode_jpeg also supports)."""

from __future__ import annotations

import argparse
import io
import logging
import random

import pytest
import torch
from PIL import Image

from resnet50_trainer.data import transforms
from resnet50_trainer.data.cpu_decode import CpuDecode
from resnet50_trainer.data.formats.images import jpeg_header
from resnet50_trainer.data.gpu_decode import BatchDecoder, GpuDecode
from resnet50_trainer.data.input_pipeline import make_loader
from resnet50_trainer.data.settings import RANDOM_RESIZED_CROP
from resnet50_trainer.tools.db import bench
from tests.support.dbfactory import (
    datum_record,
    encode_image,
    make_jpeg,
    make_undecodable_jpeg,
    smooth_pixels,
    write_db,
)
from tests.support.image_records import records_of

CPU = torch.device("cpu")


def jpeg_of(image, **options):
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", **options)
    return buffer.getvalue()


def test_bench_refuses_gpu_decoding_without_a_gpu_in_one_line(image_db, capsys):
    db = image_db("bench", 4, 4)
    assert bench.main([db, "--decode_device", "gpu"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


@pytest.mark.parametrize("start", [False, True], ids=["warm_up", "start"])
def test_bench_times_its_first_batch_only_from_a_start_it_is_given(tmp_path, capsys, start):
    # One undecodable record among 8, a batch of 8, one batch after the first: a batch a
    # bench counts holds it once.
    records = [(b"%08d" % i, datum_record(0, encoded=make_jpeg(40, 40, seed=i))) for i in range(7)]
    records.append((b"%08d" % 7, datum_record(0, encoded=make_undecodable_jpeg())))
    db = write_db(str(tmp_path / "db"), "lmdb", records)
    starts = []
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args([db, "--batch_size", "8", "--batches", "1", "--num_workers", "0"])
    args.image_size = 32
    bench.bench(args, start=(lambda: starts.append(1)) if start else None)
    assert starts == ([1] if start else [])
    assert f"skipped {2 if start else 1} records" in capsys.readouterr().out


# The training crops both paths are compared on: the default, and random-resized boxes of at
# least a third of the image (so that the larger images' boxes allow a reduced decode).
CROPS = [{}, {"crop": RANDOM_RESIZED_CROP, "crop_area": (0.33, 1.0)}]


def cpu_and_gpu_path_batches(db, count, crop):
    """For train and test: (the CPU path's batch, the GPU path's, run on the CPU) of `count`
    records."""
    for train in (True, False):
        batch_items = [[(p, p) for p in range(count)]] if train else [list(range(count))]
        cpu, encoded = (
            next(iter(make_loader(records_of(decoding, db, train, **crop), batch_items, 0, False)))
            for decoding in (CpuDecode, GpuDecode)
        )
        assert all(span is not None for span in encoded.spans)
        yield cpu, BatchDecoder(CPU, 3, 32)(encoded)


def db_of_8_jpegs(tmp_path, height: int, width: int, taller: int, wider: int) -> str:
    """Record i: label i % 4, a JPEG of (height + taller * i) x (width + wider * i) pixels."""

    def jpeg(i: int) -> bytes:
        return make_jpeg(height + taller * i, width + wider * i, seed=i)

    records = [(b"%08d" % i, datum_record(i % 4, encoded=jpeg(i))) for i in range(8)]
    return write_db(str(tmp_path / "db"), "lmdb", records)


@pytest.mark.parametrize("crop", CROPS, ids=["scale", "random_resized"])
def test_gpu_decode_path_cuts_the_cpu_paths_crops(tmp_path, crop):
    # Shorter side below 2 x scale (40) and every box below 2 x 32 pixels high, so the CPU path
    # decodes at full size too.
    db = db_of_8_jpegs(tmp_path, 50, 60, 1, 7)
    for cpu, decoded in cpu_and_gpu_path_batches(db, 8, crop):
        # Both decoders are libjpeg-turbo and both resizes PyTorch's: the same pixels.
        assert torch.equal(decoded.images, cpu.images) and torch.equal(decoded.labels, cpu.labels)


@pytest.mark.parametrize("crop", CROPS, ids=["scale", "random_resized"])
def test_cpu_paths_dct_scaled_crops_are_close_to_the_full_decodes(tmp_path, crop):
    # Shorter side 2 to 4 x scale (40), or boxes 2 to 4 x 32: the CPU path decodes at 1/2 scale,
    # the GPU path at full size, and the same plan cuts both (each in its own pixels). Tolerance:
    # mean absolute difference under 3 levels a crop (here 0.3 to 1.9: the DCT's filter against
    # PyTorch's antialiased bilinear; a crop shifted by a pixel would be off by about the noise,
    # 4 levels).
    db = db_of_8_jpegs(tmp_path, 80, 90, 9, 13)
    for cpu, decoded in cpu_and_gpu_path_batches(db, 8, crop):
        difference = (cpu.images.float() - decoded.images.float()).abs()
        assert difference.mean(dim=(1, 2, 3)).max() < 3 and torch.equal(decoded.labels, cpu.labels)
        assert not torch.equal(decoded.images, cpu.images)  # the scaled decode did happen


def test_cpu_path_reads_gray_and_cmyk_jpegs_and_counts_a_truncated_one_as_bad(tmp_path):
    colour = Image.fromarray(smooth_pixels(96, 120, seed=4))  # 1/2 scale at --scale 40
    truncated = jpeg_of(colour)
    truncated = truncated[: len(truncated) * 3 // 5]  # the header parses, the body fails
    db = write_db(
        str(tmp_path / "db"),
        "lmdb",
        [
            (b"0_rgb", datum_record(0, encoded=jpeg_of(colour))),
            (b"1_gray", datum_record(1, encoded=jpeg_of(colour.convert("L")))),
            (b"2_cmyk", datum_record(2, encoded=jpeg_of(colour.convert("CMYK")))),  # Pillow decodes
            (b"3_bad", datum_record(3, encoded=truncated)),
        ],
    )
    batch = next(
        iter(make_loader(records_of(CpuDecode, db, train=False), [list(range(4))], 0, False))
    )
    assert batch.bad_keys == [b"3_bad"] and batch.labels.tolist() == [0, 1, 2, 0]
    rgb, gray, cmyk = batch.images[:3].float()
    assert (gray[0] == gray[1]).all() and (gray[1] == gray[2]).all()
    luma = (torch.tensor([0.299, 0.587, 0.114])[:, None, None] * rgb).sum(dim=0)
    assert (gray[0] - luma).abs().mean() < 3  # the same picture
    assert (cmyk - rgb).abs().mean() < 3


def test_gpu_decode_falls_back_to_cpu_for_raw_and_png_and_names_bad_jpegs(tmp_path, caplog):
    pixels = smooth_pixels(48, 56, seed=3)
    db = write_db(
        str(tmp_path / "db"),
        "lmdb",
        [
            (b"0_jpeg", datum_record(0, encoded=make_jpeg(48, 56, seed=3))),
            (b"1_png", datum_record(1, encoded=encode_image(pixels, "PNG"))),
            (b"2_raw", datum_record(2, pixels=pixels)),
            (b"3_bad", datum_record(3, encoded=make_undecodable_jpeg())),
        ],
    )
    items = [[(p, p) for p in range(4)]]
    cpu = next(iter(make_loader(records_of(CpuDecode, db), items, 0, False)))
    encoded = next(iter(make_loader(records_of(GpuDecode, db), items, 0, False)))
    assert [span is None for span in encoded.spans] == [False, True, True, False]
    with caplog.at_level(logging.WARNING):
        decoded = BatchDecoder(CPU, 3, 32)(encoded)
    assert "raw pixels, PNG" in caplog.text
    assert decoded.bad_keys == [b"3_bad"]
    assert torch.equal(decoded.images[1:3], cpu.images[1:3])  # the fallback is the CPU path
    assert torch.equal(decoded.images[3], decoded.images[0])  # filled with a good sample
    assert decoded.labels.tolist() == [0, 1, 2, 0]  # and with its label, not the failed record's


def test_both_paths_fill_a_batch_alike_when_input_and_device_failures_meet(tmp_path):
    """A record the device fails on, beside one the input process failed on: each is named once,
    and both paths put the two decoded records first, then copies of them."""
    db = write_db(
        str(tmp_path / "db"),
        "lmdb",
        [
            (b"0_bad_jpeg", datum_record(0, encoded=make_undecodable_jpeg(160, 200, seed=1))),
            (b"1_garbage", b"\x08\x01 not a record"),
            (b"2_jpeg", datum_record(2, encoded=make_jpeg(48, 56, seed=2))),
            (b"3_jpeg", datum_record(3, encoded=make_jpeg(50, 60, seed=3))),
        ],
    )
    items = [[(p, p) for p in range(4)]]
    cpu = next(iter(make_loader(records_of(CpuDecode, db), items, 0, False)))
    encoded = next(iter(make_loader(records_of(GpuDecode, db), items, 0, False)))
    decoded = BatchDecoder(CPU, 3, 32)(encoded)
    for batch in (cpu, decoded):
        assert sorted(batch.bad_keys) == [b"0_bad_jpeg", b"1_garbage"] and batch.num_real == 2
        assert batch.labels.tolist() == [2, 3, 2, 3]
    assert torch.equal(decoded.images, cpu.images)


def test_resize_crop_matches_on_uint8_and_float_paths():
    image = torch.from_numpy(smooth_pixels(50, 70, seed=2)).permute(2, 0, 1)
    plan = transforms.random_plan(70, 50, 40, 32, random.Random(1))
    uint8_path = transforms.resize_crop(image, plan, 32)
    float_path = transforms.resize_crop(image.to("meta"), plan, 32)  # the non-CPU branch's shapes
    assert uint8_path.shape == float_path.shape == (3, 32, 32)
    assert uint8_path.dtype == float_path.dtype == torch.uint8


def test_jpeg_header_reads_the_frame_size_and_leaves_the_rest_to_pillow():
    pixels = smooth_pixels(30, 40, seed=1)

    def header(data=None):
        frame = jpeg_header(data)
        return frame and frame.size

    rgb = Image.fromarray(pixels)
    assert header(jpeg_of(rgb)) == header(jpeg_of(rgb, progressive=True)) == (40, 30)
    assert header(jpeg_of(rgb.convert("L"))) == (40, 30)
    assert header(jpeg_of(rgb.convert("CMYK"))) is None  # decoded on the CPU by Pillow
    assert header(encode_image(pixels, "PNG")) is None and header(None) is None  # raw pixels
    assert header(jpeg_of(rgb)[:20]) is None  # cut before the frame header


def test_bench_counts_and_names_the_records_it_skips(tmp_path, capsys):
    db = write_db(
        str(tmp_path / "db"),
        "lmdb",
        [(b"%d" % i, datum_record(i, encoded=make_jpeg(40, 48, seed=i))) for i in range(3)]
        + [(b"3_bad", datum_record(3, encoded=make_undecodable_jpeg()))],
    )
    flags = ["--batch_size", "4", "--image_size", "32", "--batches", "2", "--num_workers", "0"]
    assert bench.main([db, *flags]) == 0
    assert "skipped 2 records that cannot be read (the first: 3_bad;" in capsys.readouterr().out
