"""Seeded fuzzing of the record reader: damaged Datum and TensorProtos values, read the way the
trainer reads them (parse, JPEG header + libjpeg-turbo reduced decode, Pillow decode), may fail only
with RecordError, the counted skip."""

from __future__ import annotations

import random
import tracemalloc
import warnings
from collections.abc import Callable

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from PIL import Image

from dbfactory import (
    datum_record,
    encode_image,
    make_jpeg,
    random_pixels,
    smooth_pixels,
    tensorprotos_record,
)
from resnet50_trainer.data.formats import protos
from resnet50_trainer.data.formats.records import (
    decode_image,
    decode_jpeg_reduced,
    jpeg_header,
    jpeg_reduction,
    parse_record,
)
from resnet50_trainer.errors import RecordError

SEED = 20240611
MUTATIONS_PER_SEED_VALUE = 500
HUGE = (2**31 - 1, 2**31, 2**32 + 3, 2**62, -1, -(2**31), 0)


def seed_values() -> list[bytes]:
    """One valid value of every layout the trainer reads."""
    colour, gray = random_pixels(6, 9, 3, seed=1), random_pixels(5, 4, 1, seed=2)
    jpeg, png = make_jpeg(40, 48), encode_image(smooth_pixels(12, 10, 3), "PNG")
    return [
        datum_record(1, colour),
        datum_record(2, gray, as_float=True),
        datum_record(3, encoded=jpeg),
        datum_record(4, encoded=png),
        tensorprotos_record(5, encoded=jpeg),
        tensorprotos_record(6, colour),
        tensorprotos_record(7, gray),
        tensorprotos_record(8, colour, as_float=True, bbox=[1, 2, 3, 4]),
    ]


def read_like_the_trainer(value: bytes) -> None:
    record = parse_record(value)
    size = jpeg_header(record)
    if size is not None:
        try:
            decode_jpeg_reduced(record.encoded, size, 3, jpeg_reduction(min(size), 16))
        except RecordError:
            pass  # the trainer then lets Pillow judge it, as below
    decode_image(record, 3, draft_size=(16, 16))
    decode_image(record, 1)


# Byte-level damage -------------------------------------------------------------------------------


def flip_bytes(value: bytes, rng: random.Random) -> bytes:
    data = bytearray(value)
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    return bytes(data)


def truncate(value: bytes, rng: random.Random) -> bytes:
    return value[: rng.randrange(len(value))]


def insert_junk(value: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(value) + 1)
    return value[:at] + rng.randbytes(rng.randint(1, 16)) + value[at:]


def extra_field(value: bytes, rng: random.Random) -> bytes:
    """An unknown or repeated field appended: any number, any wire type, with a plausible body."""
    number, wire_type = rng.randint(1, 40), rng.choice([0, 1, 2, 5])
    body = {
        0: _varint(rng.choice(HUGE) % 2**64),
        1: rng.randbytes(8),
        5: rng.randbytes(4),
        2: _varint(n := rng.randint(0, 12)) + rng.randbytes(n),
    }[wire_type]
    return value + _varint(number << 3 | wire_type) + body


def wrong_wire_type(value: bytes, rng: random.Random) -> bytes:
    """The first byte (a field tag) given another wire type: a known field read as the wrong
    kind."""
    return bytes([value[0] & ~7 | rng.choice([0, 1, 2, 3, 4, 5, 6, 7])]) + value[1:]


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        low, number = number & 0x7F, number >> 7
        out.append(low | (0x80 if number else 0))
        if not number:
            return bytes(out)


# Field-level damage, on parsed messages ----------------------------------------------------------


def datum_fields(value: bytes, rng: random.Random) -> bytes:
    datum = protos.Datum.FromString(value)
    field = rng.choice(
        ["channels", "height", "width", "label", "data", "float_data", "encoded", "huge"]
    )
    if field == "huge":  # a declared size no allocation may follow
        for name in ("channels", "height", "width"):
            setattr(datum, name, rng.choice(HUGE + (1, 3)) if rng.random() < 0.7 else 1)
    elif field in ("channels", "height", "width", "label"):
        setattr(datum, field, rng.choice(HUGE + (1, 3)) % 2**31 * rng.choice([1, -1]))
    elif field == "encoded":
        datum.encoded = not datum.encoded
    elif field == "float_data":
        datum.float_data.extend(
            [rng.choice([float("nan"), float("inf"), -1e30, 3.5])] * rng.randint(0, 5)
        )
    else:
        datum.ClearField(field)
    return datum.SerializeToString()


def tensorprotos_fields(value: bytes, rng: random.Random) -> bytes:
    message = protos.TensorProtos.FromString(value)
    tensor = message.protos[rng.randrange(len(message.protos))]
    choice = rng.choice(["dims", "data_type", "drop", "int32", "float", "strings", "no_tensors"])
    if choice == "dims":
        del tensor.dims[:]
        tensor.dims.extend(rng.choice(HUGE + (1, 3)) for _ in range(rng.randint(0, 4)))
    elif choice == "data_type":
        tensor.data_type = rng.choice(list(protos.DATA_TYPES.values()))
    elif choice == "drop":
        tensor.ClearField(
            rng.choice(
                ["dims", "data_type", "float_data", "int32_data", "byte_data", "string_data"]
            )
        )
    elif choice == "int32":  # label or pixels as out-of-range int32 values
        tensor.int32_data.extend(
            rng.choice([-1, 256, 2**31 - 1, -(2**31)]) for _ in range(rng.randint(1, 6))
        )
    elif choice == "float":
        tensor.float_data.extend([rng.choice([float("nan"), float("-inf"), 1e38])] * 3)
    elif choice == "strings":
        tensor.string_data.append(rng.randbytes(rng.randint(0, 20)))
    else:
        del message.protos[:]
    return message.SerializeToString()


def payload_damage(value: bytes, rng: random.Random) -> bytes:
    """The message stays well-formed, its image bytes (file or pixels) do not."""
    try:
        if value[0] == 0x0A:
            message = protos.TensorProtos.FromString(value)
            image = message.protos[0]
            if len(image.string_data):
                image.string_data[0] = _damaged(image.string_data[0], rng)
            else:
                image.byte_data = _damaged(image.byte_data, rng)
        else:
            message = protos.Datum.FromString(value)
            message.data = _damaged(message.data, rng)
    except (DecodeError, IndexError):
        return flip_bytes(value, rng)
    return message.SerializeToString()


def _damaged(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return data
    # The file header (sizes, tables, chunk lengths), where decoders trust most.
    if rng.random() < 0.5:
        head = min(len(data), 160)
        return flip_bytes(data[:head], rng) + data[head:]
    return rng.choice([flip_bytes, truncate, insert_junk])(data, rng)


def field_damage(value: bytes, rng: random.Random) -> bytes:
    """Damage to one field of the parsed message; byte damage when it no longer parses."""
    try:
        return (tensorprotos_fields if value[0] == 0x0A else datum_fields)(value, rng)
    except (DecodeError, ValueError, IndexError):  # already broken, or no tensor to pick
        return flip_bytes(value, rng)


MUTATIONS: list[Callable[[bytes, random.Random], bytes]] = [
    flip_bytes,
    truncate,
    insert_junk,
    extra_field,
    wrong_wire_type,
    field_damage,
    field_damage,
    payload_damage,
    payload_damage,
    payload_damage,
]


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
    assert jpeg_header(record) is None  # not for libjpeg-turbo or nvJPEG: Pillow refuses it
    with pytest.raises(RecordError, match="pixels"):
        decode_image(record, 3, draft_size=(16, 16))
    assert np.asarray(
        decode_image(parse_record(datum_record(0, encoded=make_jpeg(16, 16))), 3)
    ).shape == (16, 16, 3)
