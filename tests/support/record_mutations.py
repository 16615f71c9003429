"""Damaged records for fuzzing, seeded: one valid value of every layout the trainer reads
(seed_values), and the ways to damage one (MUTATIONS: flipped bytes, truncation, junk, extra or
mistyped fields, damaged sizes and payloads)."""

from __future__ import annotations

import random
from collections.abc import Callable

from google.protobuf.message import DecodeError

from resnet50_trainer.data.formats import protos
from tests.support.dbfactory import (
    datum_record,
    encode_image,
    make_jpeg,
    random_pixels,
    smooth_pixels,
    tensorprotos_record,
)

# Sizes and counts that overflow 32 and 64 bits, or are negative or zero.
HUGE = (2**31 - 1, 2**31, 2**32 + 3, 2**62, -1, -(2**31), 0)
SEED = 20240611


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
