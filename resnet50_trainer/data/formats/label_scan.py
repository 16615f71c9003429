"""A record's label read from the protobuf wire format without parsing (or copying) its image.

A Datum's label (field 5) follows its image bytes (field 4), and a TensorProtos' label tensor
follows its image tensor: a full parse copies the image (~110 KB an ImageNet JPEG) only to throw
it away. Here length-delimited fields are stepped over by their length prefix, so a scan of a
memoryview into an LMDB's map touches about two pages of each record.

`quick_label` answers only when the wire format is plain (the layouts the writers produce); it
returns None for anything unusual, and the caller then parses the record in full. Where the full
parse succeeds, a label found here is the one it finds (protobuf keeps the last value of a scalar
field), so a check on quick labels refuses no more and no fewer DBs than one on parsed records.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from resnet50_trainer.data.formats import protos
from resnet50_trainer.data.formats.protos import message_class
from resnet50_trainer.data.formats.record_view import read_varint
from resnet50_trainer.data.formats.records import parse_record
from resnet50_trainer.errors import RecordError

_VARINT, _FIXED64, _LENGTH_DELIMITED, _FIXED32 = 0, 1, 2, 5
_DATUM_LABEL = 5
_TENSORPROTOS_PROTOS = 1
_TENSORPROTOS_FIRST_BYTE = 0x0A  # as in records.py: a TensorProtos starts with field 1's tag
_TensorProto = message_class(protos._POOL, "caffe2.TensorProto")


class _Unusual(Exception):
    """The wire format is not the plain one: let the full parse decide."""


def _varint(data: memoryview, position: int) -> tuple[int, int]:
    value, position = read_varint(data, position)
    if position < 0:
        raise _Unusual
    return value, position


def _fields(data: memoryview) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value or length, start of the payload) of each top-level field."""
    position = 0
    while position < len(data):
        tag, position = _varint(data, position)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise _Unusual
        if wire_type == _VARINT:
            value, position = _varint(data, position)
            yield number, wire_type, value, position
        elif wire_type == _LENGTH_DELIMITED:
            length, start = _varint(data, position)
            position = start + length
            if position > len(data):
                raise _Unusual
            yield number, wire_type, length, start
        elif wire_type in (_FIXED64, _FIXED32):
            position += 8 if wire_type == _FIXED64 else 4
            if position > len(data):
                raise _Unusual
        else:  # groups and invalid wire types
            raise _Unusual


def _int32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _datum_label(data: memoryview) -> int:
    label = 0  # proto2 default
    for number, wire_type, value, _ in _fields(data):
        if number == _DATUM_LABEL:
            if wire_type != _VARINT:
                raise _Unusual
            label = _int32(value)
    return label


def _tensorprotos_label(data: memoryview) -> int:
    tensors = [
        (wire_type, length, start)
        for number, wire_type, length, start in _fields(data)
        if number == _TENSORPROTOS_PROTOS
    ]
    if len(tensors) < 2 or any(wire_type != _LENGTH_DELIMITED for wire_type, _, _ in tensors):
        raise _Unusual
    _, length, start = tensors[1]  # protos[1]: the label tensor, small; parse it for real
    try:
        tensor = _TensorProto.FromString(bytes(data[start : start + length]))
    except Exception:  # protobuf's DecodeError and friends vary between versions
        raise _Unusual from None
    if tensor.data_type != protos.INT32 or not len(tensor.int32_data):
        raise _Unusual
    return int(tensor.int32_data[0])


def quick_label(value: bytes | memoryview) -> int | None:
    """The record's label, or None where only a full parse can tell (see the module's note)."""
    data = memoryview(value)
    if not len(data):
        return None
    try:
        if data[0] == _TENSORPROTOS_FIRST_BYTE:
            return _tensorprotos_label(data)
        return _datum_label(data)
    except _Unusual:
        return None


@dataclass
class LabelScan:
    """What a bounded scan of a DB's labels found."""

    checked: int  # records whose labels were read
    complete: bool  # every record it was asked to read was read
    outside: tuple[bytes, int] | None  # the first record (key, label) outside 0..num_labels-1
    highest: int | None  # the highest label read


def scan_labels(
    items: Iterable[tuple[bytes, bytes | memoryview]],
    num_labels: int,
    budget_s: float,
    limit: int | None = None,
    past_outside: bool = False,
) -> LabelScan:
    """The labels of `items` (a DB's (key, value)s in key order; the first `limit` of them)
    against 0..num_labels-1, read for at most `budget_s` seconds. A record's label comes from its
    wire format (quick_label); only one it cannot tell, or one out of range, is parsed in full,
    and no image is decoded. A record that does not parse is skipped (it is an unreadable record,
    not a label). It stops at the first label outside, or with `past_outside` reads on (within
    the budget) for the highest label, which the fix names."""
    started = time.monotonic()
    outside: tuple[bytes, int] | None = None
    highest: int | None = None
    checked = 0
    for key, value in items:
        if checked == limit:
            break
        if checked % 256 == 0 and time.monotonic() - started > budget_s:
            return LabelScan(checked, False, outside, highest)
        checked += 1
        label = quick_label(value)
        if label is None or not 0 <= label < num_labels:
            try:
                label = parse_record(bytes(value)).label
            except RecordError:
                continue
        highest = label if highest is None else max(highest, label)
        if outside is None and not 0 <= label < num_labels:
            outside = (bytes(key), label)
            if not past_outside:
                return LabelScan(checked, False, outside, highest)
    return LabelScan(checked, True, outside, highest)
