"""Where records become pixels: every valid JPEG decodes as Pillow decodes it, on every path; what
no decoder here reads, a decompression bomb and whatever a decoder raises are the record's
failure; gray is one definition everywhere."""

from __future__ import annotations

import io
import tracemalloc
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from resnet50_trainer.data.cpu_decode import CpuDecode
from resnet50_trainer.data.formats.images import MAX_PIXELS, decode_image, jpeg_header, luma
from resnet50_trainer.data.formats.jpeg_region import decode_jpeg_box, with_restart_markers
from resnet50_trainer.data.formats.records import parse_record
from resnet50_trainer.data.gpu_decode import BatchDecoder, GpuDecode
from resnet50_trainer.data.input_pipeline import make_loader
from resnet50_trainer.data.settings import RANDOM_RESIZED_CROP
from resnet50_trainer.errors import RecordError
from tests.support.dbfactory import datum_record, make_jpeg, write_db
from tests.support.image_records import records_of
from tests.support.jpeg_variants import (
    ALL_VARIANTS,
    CJPEG_VARIANTS,
    PILLOW_VARIANTS,
    jpeg_variant,
    needs_cjpeg,
    pillow_pixels,
    with_precision,
)


@pytest.mark.parametrize("variant", [*ALL_VARIANTS, "YCCK"])
def test_a_valid_jpeg_decodes_as_pillow_decodes_it(variant):
    """Pillow's decode (dump's, and the fallback's) and the trainer's own libjpeg-turbo decode of
    the whole frame, with restart markers too: the same pixels, colour and gray."""
    jpeg = jpeg_variant(variant)
    rgb, gray = pillow_pixels(jpeg)
    record = parse_record(datum_record(0, encoded=jpeg))
    assert np.array_equal(np.asarray(decode_image(record, 3)), rgb)
    assert np.array_equal(np.asarray(decode_image(record, 1)), gray)
    frame = jpeg_header(jpeg)
    assert (frame is None) == (variant in ("CMYK", "YCCK"))  # four components: Pillow's
    if frame is None:
        return
    whole = (0, 0, *frame.size)
    for data in (jpeg, with_restart_markers(jpeg)):
        assert np.array_equal(decode_jpeg_box(data, frame.size, 3, 1, whole), rgb)
        assert np.array_equal(decode_jpeg_box(data, frame.size, 1, 1, whole)[:, :, 0], gray)


@needs_cjpeg
@pytest.mark.parametrize("crop", [{}, {"crop": RANDOM_RESIZED_CROP}], ids=["scale", "random"])
@pytest.mark.parametrize("num_channels", [3, 1])
def test_the_input_pipeline_reads_every_valid_jpeg(tmp_path, crop, num_channels):
    """Training and test batches of every variant: none is a bad record, on either path (the GPU
    one run on the CPU sends what nvJPEG cannot take, arithmetic coding, to the CPU path)."""
    names = [*PILLOW_VARIANTS, *CJPEG_VARIANTS, "YCCK"]
    db = write_db(
        str(tmp_path / "db"),
        "lmdb",
        [(b"%02d" % i, datum_record(i % 4, encoded=jpeg_variant(n))) for i, n in enumerate(names)],
    )
    training = [[(p, p) for p in range(len(names))]]
    for train, items in ((True, training), (False, [list(range(len(names)))])):
        records = records_of(CpuDecode, db, train, num_channels=num_channels, **crop)
        batch = next(iter(make_loader(records, items, 0, False)))
        assert batch.bad_keys == [] and batch.images.shape[1] == num_channels
    encoded = next(iter(make_loader(records_of(GpuDecode, db, **crop), training, 0, False)))
    on_cpu = {names[i] for i, span in enumerate(encoded.spans) if span is None}
    assert on_cpu == {"CMYK", "YCCK", "arithmetic", "arithmetic progressive"}


def test_what_no_decoder_here_reads_is_a_bad_record_named_as_such(tmp_path):
    twelve_bit = with_precision(make_jpeg(32, 40), 12)
    with pytest.raises(RecordError, match="12-bit samples"):
        jpeg_header(twelve_bit)
    with pytest.raises(RecordError, match="12-bit samples"):
        decode_image(parse_record(datum_record(0, encoded=twelve_bit)), 3)
    db = write_db(
        str(tmp_path / "db"),
        "lmdb",
        [(b"0", datum_record(0, encoded=make_jpeg())), (b"1", datum_record(1, encoded=twelve_bit))],
    )
    batch = next(iter(make_loader(records_of(CpuDecode, db, False), [[0, 1]], 0, False)))
    assert batch.bad_keys == [b"1"] and batch.labels.tolist() == [0, 0]


def test_a_decompression_bomb_is_refused_from_its_header_in_every_format():
    """A JPEG and a PNG claiming 65,000 x 65,000 pixels (4 Gpixels): refused before any decoder
    allocates them, by Pillow, libjpeg-turbo and the restart-marker rewrite alike."""
    jpeg = bytearray(make_jpeg(16, 16))
    frame = jpeg.index(b"\xff\xc0")
    jpeg[frame + 5 : frame + 9] = (65000).to_bytes(2, "big") * 2
    png = io.BytesIO()
    Image.new("RGB", (16, 16)).save(png, "PNG")
    png_bomb = bytearray(png.getvalue())
    png_bomb[16:24] = (65000).to_bytes(4, "big") * 2  # IHDR's width and height, then its CRC
    png_bomb[29:33] = zlib.crc32(png_bomb[12:29]).to_bytes(4, "big")
    tracemalloc.start()
    try:
        for data in (bytes(jpeg), bytes(png_bomb)):
            with pytest.raises(RecordError, match=f"over the limit of {MAX_PIXELS:,}"):
                decode_image(parse_record(datum_record(0, encoded=data)), 3)
        with pytest.raises(RecordError, match="65000x65000 pixels"):
            with_restart_markers(bytes(jpeg))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_any_error_of_a_decoder_is_the_records_failure(monkeypatch):
    """Pillow's plugins raise many kinds on hostile bytes (KeyError, struct.error, ...)."""

    def broken_open(*_):
        raise KeyError(6)

    monkeypatch.setattr(Image, "open", broken_open)
    record = parse_record(datum_record(0, encoded=make_jpeg()))
    with pytest.raises(RecordError, match=r"cannot decode the record's image bytes \(KeyError"):
        decode_image(record, 3)


def test_gray_is_one_definition_on_every_path():
    """Pillow's "L" of the RGB pixels (not libjpeg's or nvJPEG's Y): luma computes it, and the GPU
    path's decoder (run on the CPU) gives it; the CPU paths' gray is checked above, per variant."""
    jpeg = jpeg_variant("4:2:0")
    rgb, gray = (torch.from_numpy(np.array(pixels)) for pixels in pillow_pixels(jpeg))
    assert torch.equal(luma(*rgb.permute(2, 0, 1).int()).to(torch.uint8), gray)
    file = torch.frombuffer(bytearray(jpeg), dtype=torch.uint8)
    decoded = BatchDecoder(torch.device("cpu"), 1, 32)._decode_now([file])[0]
    assert torch.equal(decoded, gray[None])
