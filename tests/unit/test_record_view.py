"""parse_record_view (data/formats/record_view.py) reads every record as parse_record does, with an
encoded Datum's file as a view of the value instead of a copy, and LMDB hands out such views."""

from __future__ import annotations

import random

import numpy as np
import pytest

from resnet50_trainer.data.formats import protos
from resnet50_trainer.data.formats.databases import open_database
from resnet50_trainer.data.formats.db_types import DB_TYPES
from resnet50_trainer.data.formats.record_view import parse_record_view
from resnet50_trainer.data.formats.records import parse_record
from resnet50_trainer.errors import RecordError
from tests.support.dbfactory import (
    datum_record,
    encoded_of,
    make_jpeg,
    random_pixels,
    tensorprotos_record,
    write_db,
)


def datum(**fields) -> bytes:
    return protos.Datum(**fields).SerializeToString()


JPEG = make_jpeg(16, 24)
VALUES = [
    datum_record(3, encoded=JPEG),
    datum(data=JPEG, label=-5, encoded=True),  # negative int32: a ten-byte varint
    datum(data=JPEG, label=2**31 - 1, encoded=True),
    datum(data=JPEG, label=7, encoded=True, channels=3, height=16, width=24),
    datum(data=JPEG, encoded=True),  # label 0, left out by the serializer
    datum(data=JPEG, label=1, encoded=False),  # raw bytes of the wrong size: an error
    datum(data=b"", label=1, encoded=True),
    datum(label=1, encoded=True),
    datum(data=JPEG, label=1, encoded=True, float_data=[1.0]),
    datum_record(1, pixels=random_pixels(4, 5)),
    datum_record(1, pixels=random_pixels(4, 5), as_float=True),
    tensorprotos_record(2, encoded=JPEG),
    tensorprotos_record(2, pixels=random_pixels(4, 5)),
    # Fields twice (the last wins), an unknown field, and the fields out of order.
    datum(data=b"x", label=1, encoded=True) + datum(data=JPEG, label=9),
    datum(data=JPEG, label=1, encoded=True) + b"\x40\x01",
    datum(encoded=True) + datum(label=4) + datum(data=JPEG),
    b"",
    b"\x08",
    b"\x22\xff\xff\xff\xff\x0f",  # data longer than the value
]


def outcome(parse, value):
    try:
        record = parse(value)
    except RecordError as error:
        return "RecordError", str(error)
    pixels = None if record.pixels is None else record.pixels.tobytes()
    encoded = None if record.encoded is None else bytes(record.encoded)
    return record.label, encoded, pixels, record.format


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_a_record_reads_as_parse_record_reads_it(value):
    assert outcome(parse_record_view, memoryview(value)) == outcome(parse_record, value)


def test_damaged_records_read_as_parse_record_reads_them():
    rng = random.Random(0)
    for value in VALUES[:5]:
        for _ in range(200):
            damaged = bytearray(value)
            for _ in range(rng.randint(1, 3)):
                damaged[rng.randrange(len(damaged))] = rng.randrange(256)
            cut = bytes(damaged[: rng.randint(0, len(damaged))] if rng.random() < 0.3 else damaged)
            assert outcome(parse_record_view, cut) == outcome(parse_record, cut)


def test_an_encoded_datums_file_is_a_view_not_a_copy():
    value = bytearray(datum_record(3, encoded=JPEG))
    record = parse_record_view(memoryview(value))
    assert isinstance(record.encoded, memoryview) and record.encoded.obj is value
    assert bytes(record.encoded) == JPEG


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_a_database_views_its_values(tmp_path, db_type):
    values = [datum_record(i, encoded=make_jpeg(8, 8, seed=i)) for i in range(5)]
    path = write_db(str(tmp_path / "db"), db_type, [(b"%d" % i, v) for i, v in enumerate(values)])
    with open_database(path, db_type) as database:
        views = [database.view(b"%d" % i) for i in range(5)]
        assert [bytes(view) for view in views] == values  # earlier views stay valid
        assert isinstance(views[0], memoryview if db_type == "lmdb" else bytes)
        assert np.array_equal(
            np.frombuffer(encoded_of(parse_record_view(views[2])), np.uint8),
            np.frombuffer(encoded_of(parse_record(values[2])), np.uint8),
        )
