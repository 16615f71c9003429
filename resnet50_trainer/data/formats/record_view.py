"""parse_record without copying the image: an encoded Datum's file bytes as a view into the value.

Caffe's convert_imageset --encoded writes each record as a Datum holding a JPEG in `data`, a
label and encoded=true. The protobuf parse copies the file out of the value (after the database
copied the value out of its pages); here the few fields of such a record are walked by hand and
`Record.encoded` is a memoryview of the value: with an LMDB read through a view of its memory map
(db_reader.Database.view), the file goes from the map into the decoder without a copy. Anything
else (TensorProtos, raw pixels, float_data, a field we do not know, a damaged record) goes to
records.parse_record, which judges it as before.
"""

from __future__ import annotations

from resnet50_trainer.data.formats.records import DATUM, Record, parse_record

_VARINT, _LENGTH_DELIMITED = 0, 2
_DATA, _LABEL, _ENCODED = 4, 5, 7
_VARINT_FIELDS = (1, 2, 3, _LABEL, _ENCODED)  # channels, height, width, label, encoded


def parse_record_view(value: bytes | memoryview) -> Record:
    """The record in `value`, as parse_record reads it; for an encoded Datum, `encoded` is a view
    of `value` (valid while `value` is)."""
    view = memoryview(value)
    found = _encoded_datum(view)
    if found is None:
        return parse_record(bytes(view))
    label, start, end = found
    return Record(label=label, encoded=view[start:end], pixels=None, format=DATUM)


def _encoded_datum(view: memoryview) -> tuple[int, int, int] | None:
    """(label, start, end of the file bytes) of an encoded Datum with data and only the fields
    above; None for anything else."""
    size, position = len(view), 0
    label, data, encoded = 0, None, False
    while position < size:
        tag, position = read_varint(view, position)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == _VARINT and number in _VARINT_FIELDS:
            number_value, position = read_varint(view, position)
            if number == _LABEL:
                label = number_value
            elif number == _ENCODED:
                encoded = number_value != 0
        elif wire_type == _LENGTH_DELIMITED and number == _DATA:
            length, position = read_varint(view, position)
            if position + length > size:
                return None
            data, position = (position, position + length), position + length
        else:
            return None
        if position < 0:  # a varint ran off the end
            return None
    if not encoded or data is None or data[0] == data[1]:
        return None
    label &= 0xFFFFFFFF  # int32, as protobuf reads it: the low 32 bits, signed
    return (label - (1 << 32) if label >= 1 << 31 else label), data[0], data[1]


def read_varint(view: memoryview, position: int) -> tuple[int, int]:
    """(value, position after it); position -1 if the varint runs past the end or 10 bytes."""
    value, shift = 0, 0
    while position < len(view) and shift < 70:
        byte = view[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
    return 0, -1
