"""Database records <-> (image, label): Caffe Datum and Caffe2 TensorProtos, detected per record.

The one place records are parsed, built and decoded; the trainer and `resnet50-db` share it.

Layouts (as the original tools write them):
- Datum (convert_imageset): encoded=true -> data holds a JPEG/PNG file; otherwise data holds raw
  uint8 pixels CHW in BGR order with channels/height/width set (or float_data, same layout).
- TensorProtos (make_image_db): protos[0] is the image, protos[1] an INT32 label (a further tensor,
  e.g. a bounding box, is ignored). Image STRING -> string_data[0] is the file; BYTE/UINT8 -> raw
  pixels HWC in BGR, dims [H, W, C] or [H, W] for gray; FLOAT -> dims [C, H, W] (or [H, W]), BGR,
  as lmdb_create_example.py writes them. We assume FLOAT tensors hold pixel values on the 0..255
  scale and clip/round them to uint8; a tensor of 0..1 values therefore decodes nearly black.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from resnet50_trainer.data.formats import protos
from resnet50_trainer.errors import RecordError

DATUM = "datum"
TENSORPROTOS = "tensorprotos"
RECORD_FORMATS = (DATUM, TENSORPROTOS)

# Serializers write fields in number order, so a TensorProtos starts with the tag of field 1 as a
# length-delimited message (0x0A); a Datum never does (its field 1 is a varint, tag 0x08).
_TENSORPROTOS_FIRST_BYTE = 0x0A


@dataclass(frozen=True, eq=False)  # eq=False: numpy arrays have no single truth value
class Record:
    """One image and its label. Exactly one of `encoded` (file bytes) and `pixels` is set;
    `encoded` may be a view into a database's memory (record_view), valid while it is open."""

    label: int
    encoded: bytes | memoryview | None
    pixels: np.ndarray | None  # HxWxC uint8, RGB order, C = 1 or 3
    format: str  # DATUM or TENSORPROTOS

    @property
    def is_encoded(self) -> bool:
        return self.encoded is not None


def parse_record(value: bytes) -> Record:
    """Parse one database value; raises RecordError naming what is wrong."""
    if not value:
        raise RecordError("empty record value; rebuild the database with resnet50-db create")
    is_tensorprotos = value[0] == _TENSORPROTOS_FIRST_BYTE
    try:
        message = (protos.TensorProtos if is_tensorprotos else protos.Datum).FromString(value)
    except Exception as exc:  # protobuf's DecodeError and friends vary between versions
        raise RecordError(
            f"record is neither a Caffe Datum nor a Caffe2 TensorProtos ({exc}); "
            "check that the database was written by convert_imageset, "
            "make_image_db or resnet50-db create"
        ) from exc
    # Only the protobuf parse is caught wholesale: what follows raises RecordError itself, so a
    # bug of ours is not mistaken for a damaged record.
    return _parse_tensorprotos(message) if is_tensorprotos else _parse_datum(message)


def _parse_datum(datum) -> Record:
    if datum.encoded:
        if not datum.data:
            raise RecordError("Datum is marked encoded but holds no image bytes")
        return Record(label=datum.label, encoded=bytes(datum.data), pixels=None, format=DATUM)
    shape = (datum.channels, datum.height, datum.width)
    if datum.data:
        chw = _raw_array(datum.data, shape, "Datum", channel_axis=0)
    elif len(datum.float_data):
        chw = _float_to_uint8(np.asarray(datum.float_data, dtype=np.float32), shape, "Datum")
    else:
        raise RecordError("Datum holds neither image bytes nor float_data (zero-size record)")
    return Record(
        label=datum.label, encoded=None, pixels=bgr_to_rgb(chw.transpose(1, 2, 0)), format=DATUM
    )


def _parse_tensorprotos(tensors) -> Record:
    if len(tensors.protos) < 2:
        raise RecordError(
            f"TensorProtos has {len(tensors.protos)} tensor(s); "
            "expected an image tensor and an INT32 label tensor"
        )
    image, label_tensor = tensors.protos[0], tensors.protos[1]
    if label_tensor.data_type != protos.INT32 or not len(label_tensor.int32_data):
        raise RecordError("TensorProtos label (protos[1]) is not a non-empty INT32 tensor")
    label = int(label_tensor.int32_data[0])
    if image.data_type == protos.STRING:
        if not len(image.string_data) or not image.string_data[0]:
            raise RecordError("TensorProtos STRING image tensor holds no image bytes")
        return Record(
            label=label, encoded=bytes(image.string_data[0]), pixels=None, format=TENSORPROTOS
        )
    dims = tuple(image.dims)
    if len(dims) not in (2, 3):
        raise RecordError(f"TensorProtos image has dims {list(dims)}; expected [H, W] or [H, W, C]")
    if image.data_type in (protos.BYTE, protos.UINT8):
        hwc_shape = dims if len(dims) == 3 else dims + (1,)
        raw = image.byte_data or _int32_pixels(image.int32_data)
        hwc = _raw_array(raw, hwc_shape, "TensorProtos", channel_axis=2)
    elif image.data_type == protos.FLOAT:
        chw_shape = dims if len(dims) == 3 else (1,) + dims
        chw = _float_to_uint8(
            np.asarray(image.float_data, dtype=np.float32), chw_shape, "TensorProtos"
        )
        hwc = chw.transpose(1, 2, 0)
    else:
        raise RecordError(
            f"TensorProtos image has data_type {image.data_type}; "
            "expected STRING, BYTE, UINT8 or FLOAT"
        )
    return Record(label=label, encoded=None, pixels=bgr_to_rgb(hwc), format=TENSORPROTOS)


def _int32_pixels(values) -> bytes:
    """uint8 bytes of pixels some writers store as int32_data, one value per pixel."""
    pixels = np.asarray(values, dtype=np.int64)
    if pixels.size and not (0 <= pixels.min() and pixels.max() <= 255):
        raise RecordError("TensorProtos image holds int32 pixel values outside 0..255")
    return pixels.astype(np.uint8).tobytes()


def _check_shape(shape: tuple, size: int, source: str, channel_axis: int) -> None:
    """Checked before anything of that shape is made: declared sizes may be absurd."""
    if any(extent <= 0 for extent in shape):
        raise RecordError(f"{source} raw image has shape {list(shape)} (zero-size record)")
    if shape[channel_axis] not in (1, 3):
        raise RecordError(f"{source} raw image has {shape[channel_axis]} channels; expected 1 or 3")
    needed = math.prod(shape)  # Python integers: int64 dims could overflow numpy's product
    if size != needed:
        raise RecordError(
            f"{source} raw image holds {size} values but its shape {list(shape)} needs {needed}"
        )


def _raw_array(raw: bytes, shape: tuple, source: str, channel_axis: int) -> np.ndarray:
    _check_shape(shape, len(raw), source, channel_axis)
    return np.frombuffer(raw, dtype=np.uint8).reshape(shape)


def _float_to_uint8(values: np.ndarray, chw_shape: tuple, source: str) -> np.ndarray:
    _check_shape(chw_shape, values.size, source, channel_axis=0)
    if not np.isfinite(values).all():
        raise RecordError(f"{source} float image holds NaN or infinite values")
    return np.clip(np.rint(values), 0, 255).astype(np.uint8).reshape(chw_shape)


def serialize_record(record: Record) -> bytes:
    """The database value for `record`, laid out exactly as convert_imageset / make_image_db do."""
    if record.format == DATUM:
        return _datum_message(record).SerializeToString()
    if record.format == TENSORPROTOS:
        return _tensorprotos_message(record).SerializeToString()
    raise RecordError(f"unknown record format {record.format!r}; use one of {RECORD_FORMATS}")


def with_file_rewritten(value: bytes, rewrite: Callable[[bytes], bytes]) -> bytes:
    """The database value with the image file it holds (an encoded Datum's data, a STRING
    TensorProtos' string_data[0]) replaced by rewrite(file), every other field as it was; a
    value holding raw pixels, as it is. RecordError if it is no record (parse_record's)."""
    record = parse_record(value)
    if record.encoded is None:
        return value
    if record.format == DATUM:
        datum = protos.Datum.FromString(value)
        datum.data = rewrite(datum.data)
        return datum.SerializeToString()
    tensors = protos.TensorProtos.FromString(value)
    tensors.protos[0].string_data[0] = rewrite(tensors.protos[0].string_data[0])
    return tensors.SerializeToString()


def _datum_message(record: Record):
    if record.encoded is not None:  # convert_imageset sets only data, label and encoded here
        return protos.Datum(data=record.encoded, label=record.label, encoded=True)
    bgr = bgr_to_rgb(record_pixels(record))  # the swap is its own inverse
    height, width, channels = bgr.shape
    return protos.Datum(
        channels=channels,
        height=height,
        width=width,
        data=bgr.transpose(2, 0, 1).tobytes(),
        label=record.label,
    )


def _tensorprotos_message(record: Record):
    message = protos.TensorProtos()
    image = message.protos.add()
    if record.encoded is not None:
        image.data_type = protos.STRING
        image.dims.append(1)
        image.string_data.append(record.encoded)
    else:
        bgr = bgr_to_rgb(record_pixels(record))
        height, width, channels = bgr.shape
        image.data_type = protos.BYTE
        image.dims.extend([height, width, channels] if channels == 3 else [height, width])
        image.byte_data = bgr.tobytes()
    label = message.protos.add()
    label.data_type = protos.INT32
    label.dims.append(1)
    label.int32_data.append(record.label)
    return message


def record_pixels(record: Record) -> np.ndarray:
    """The pixels of a record without encoded bytes (a Record holds exactly one of the two)."""
    assert record.pixels is not None, "a Record holds either encoded bytes or pixels"
    return record.pixels


def bgr_to_rgb(hwc: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(hwc[:, :, ::-1] if hwc.shape[2] == 3 else hwc)
