"""Seeded fuzzing of the record reader: damaged Datum and TensorProtos values, read the way the
trainer reads them (parse, JPEG header + libjpeg-turbo reduced decode, Pillow decode), may fail only
with RecordError, the counted skip."""

from __future__ import annotations

import random
import tracemalloc
import warnings

import numpy as np
import pytest
from PIL import Image

from resnet50_trainer.data.formats import protos
from resnet50_trainer.data.formats.images import (
    decode_image,
    decode_jpeg_reduced,
    jpeg_header,
    jpeg_reduction,
)
from resnet50_trainer.data.formats.records import parse_record
from resnet50_trainer.errors import RecordError
from tests.support.dbfactory import (
    datum_record,
    encoded_of,
    make_jpeg,
)
from tests.support.record_mutations import MUTATIONS, SEED, seed_values

MUTATIONS_PER_SEED_VALUE = 500


def read_like_the_trainer(value: bytes) -> None:
    record = parse_record(value)
    frame = jpeg_header(record.encoded)
    if frame is not None:
        try:
            decode_jpeg_reduced(encoded_of(record), frame.size, jpeg_reduction(min(frame.size), 16))
        except RecordError:
            pass  # the trainer then lets Pillow judge it, as below
    decode_image(record, 3, draft_size=(16, 16))
    decode_image(record, 1)


# Byte-level damage -------------------------------------------------------------------------------


# Field-level damage, on parsed messages ----------------------------------------------------------


def test_damaged_records_fail_only_with_record_error():
    rng = random.Random(SEED)
    tried, failures = 0, []
    for base in seed_values():
        for _ in range(MUTATIONS_PER_SEED_VALUE):
            value = base
            for _ in range(rng.randint(1, 3)):  # mutations stack: damage on damage
                value = rng.choice(MUTATIONS)(value, rng) if value else value
            tried += 1
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)  # numpy's invalid casts: NaN
                warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # decoded anyway
                try:
                    read_like_the_trainer(value)
                except RecordError:
                    pass
                except Exception as exc:  # noqa: BLE001 - anything else is the bug we look for
                    failures.append((value, repr(exc)))
    print(f"{tried} damaged records tried")
    assert tried == len(seed_values()) * MUTATIONS_PER_SEED_VALUE
    assert not failures, f"{len(failures)} of {tried} escaped: {failures[:3]}"


def test_huge_declared_sizes_allocate_nothing_big():
    values = [
        protos.Datum(
            channels=3, height=2**31 - 1, width=2**31 - 1, data=b"\x01" * 12, label=0
        ).SerializeToString(),
        protos.Datum(
            channels=3, height=65536, width=65536, float_data=[1.0] * 12, label=0
        ).SerializeToString(),
    ]
    message = protos.TensorProtos()
    image = message.protos.add(data_type=protos.BYTE, byte_data=b"\x00" * 6)
    image.dims.extend([2**32, 2**32, 3])
    label = message.protos.add(data_type=protos.INT32)
    label.int32_data.append(0)
    values.append(message.SerializeToString())
    tracemalloc.start()
    try:
        for value in values:
            try:
                read_like_the_trainer(value)
            except RecordError:
                pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"peak {peak} bytes for records of a few bytes"


def test_out_of_range_int32_pixels_are_a_record_error():
    message = protos.TensorProtos()
    image = message.protos.add(data_type=protos.UINT8)
    image.dims.extend([1, 2])
    image.int32_data.extend([300, -5])
    label = message.protos.add(data_type=protos.INT32)
    label.int32_data.append(0)
    with pytest.raises(RecordError, match="outside 0..255"):
        parse_record(message.SerializeToString())


def test_a_huge_jpeg_header_is_refused_before_decoding():
    jpeg = bytearray(make_jpeg(16, 16))
    sof = jpeg.index(b"\xff\xc0")
    jpeg[sof + 5 : sof + 9] = (65000).to_bytes(2, "big") * 2  # height, width
    record = parse_record(datum_record(0, encoded=bytes(jpeg)))
    with pytest.raises(RecordError, match="65000x65000 pixels, over the limit"):
        jpeg_header(record.encoded)  # for libjpeg-turbo and nvJPEG
    with pytest.raises(RecordError, match="65000x65000 pixels, over the limit"):
        decode_image(record, 3, draft_size=(16, 16))  # and for Pillow
    assert np.asarray(
        decode_image(parse_record(datum_record(0, encoded=make_jpeg(16, 16))), 3)
    ).shape == (16, 16, 3)
