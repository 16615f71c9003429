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

import io
import math
from dataclasses import dataclass

import numpy as np
import simplejpeg
from PIL import Image, UnidentifiedImageError

from resnet50_trainer.data.formats import protos
from resnet50_trainer.errors import RecordError

DATUM = "datum"
TENSORPROTOS = "tensorprotos"
RECORD_FORMATS = (DATUM, TENSORPROTOS)

# Serializers write fields in number order, so a TensorProtos starts with the tag of field 1 as a
# length-delimited message (0x0A); a Datum never does (its field 1 is a varint, tag 0x08).
_TENSORPROTOS_FIRST_BYTE = 0x0A
# libjpeg-turbo's names of the JPEG colour spaces of 1 and 3 components (not CMYK, YCCK).
_DIRECT_COLOUR_SPACES = ("Gray", "YCbCr", "RGB")


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
        label=datum.label, encoded=None, pixels=_bgr_to_rgb(chw.transpose(1, 2, 0)), format=DATUM
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
    return Record(label=label, encoded=None, pixels=_bgr_to_rgb(hwc), format=TENSORPROTOS)


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


def _file_bytes(record: Record) -> bytes | memoryview:
    """The encoded file of a record without pixels (a Record holds exactly one of the two)."""
    assert record.encoded is not None, "a Record holds either encoded bytes or pixels"
    return record.encoded


def _pixels(record: Record) -> np.ndarray:
    """The pixels of a record without encoded bytes (a Record holds exactly one of the two)."""
    assert record.pixels is not None, "a Record holds either encoded bytes or pixels"
    return record.pixels


def _bgr_to_rgb(hwc: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(hwc[:, :, ::-1] if hwc.shape[2] == 3 else hwc)


def decode_native(record: Record, draft_size: tuple[int, int] | None = None) -> Image.Image:
    """The record's image, fully loaded, in mode "L" if stored gray, else "RGB".

    draft_size (width, height): for JPEG, let libjpeg scale down by 1/2, 1/4 or 1/8 while both sides
    stay at least this large (much cheaper than decoding at full size and resizing).
    """
    if record.pixels is not None:
        pixels = record.pixels
        return (
            Image.fromarray(pixels[:, :, 0], "L")
            if pixels.shape[2] == 1
            else Image.fromarray(pixels, "RGB")
        )
    try:
        image = Image.open(io.BytesIO(_file_bytes(record)))
        if draft_size is not None and image.format == "JPEG":
            image.draft(None, draft_size)  # None keeps the colour mode: only the scale changes
        image.load()  # decode now, so a truncated file fails here and not in a later transform
        return _to_8_bits(image)
    except UnidentifiedImageError as exc:
        raise RecordError("the record's image bytes are in no format Pillow can read") from exc
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise RecordError(f"cannot decode the record's image bytes ({exc})") from exc


def encoded_format(data: bytes | memoryview) -> str:
    """Pillow's name for the file format of `data` ("JPEG", "PNG", ...), read from its header."""
    try:
        file_format = Image.open(io.BytesIO(data)).format
    except (OSError, ValueError, SyntaxError) as exc:
        raise RecordError("the record's image bytes are in no format Pillow can read") from exc
    # Pillow names the format of every file it opens (None is for images it made itself).
    if file_format is None:
        raise RecordError("the record's image bytes are in no format Pillow can read")
    return file_format


def jpeg_header(record: Record) -> tuple[int, int] | None:
    """(width, height) of a record holding a JPEG of 1 or 3 components (gray or colour: what
    libjpeg-turbo and nvJPEG decode as they are), read from its header by libjpeg-turbo; None for
    anything else (CMYK, another format, a header cut short), which Pillow then gets to judge, and
    for frames over Pillow's decompression-bomb limit (Pillow then refuses them, before any pixel
    buffer is allocated)."""
    if record.encoded is None:
        return None
    try:
        height, width, colour_space, _ = simplejpeg.decode_jpeg_header(record.encoded)
    except ValueError:
        return None
    usable = colour_space in _DIRECT_COLOUR_SPACES and not _over_pixel_limit(width, height)
    return (width, height) if usable else None


def _over_pixel_limit(width: int, height: int) -> bool:
    """What Pillow refuses as a decompression bomb (it only warns up to twice its limit)."""
    return Image.MAX_IMAGE_PIXELS is not None and width * height > 2 * Image.MAX_IMAGE_PIXELS


def jpeg_reduction(shorter_side: int, min_side: int) -> int:
    """The largest of 8, 4 and 2 that leaves `shorter_side` / it at least `min_side`, else 1: the
    JPEG decode's reduction for an image (or a crop's box) that must keep that many pixels.

    Only powers of two: libjpeg-turbo's scaled IDCTs for 3/8, 5/8, 6/8 and 7/8 have no SIMD code
    and cost more than a full-size decode (BENCHMARKS.md, "JPEG DCT scaling")."""
    return next((factor for factor in (8, 4, 2) if shorter_side >= factor * min_side), 1)


def decode_jpeg_reduced(
    data: bytes, size: tuple[int, int], num_channels: int, reduction: int
) -> np.ndarray:
    """HWC uint8 (RGB, or one channel when num_channels is 1) of a JPEG that jpeg_header accepted,
    `size` being its (width, height), decoded by libjpeg-turbo at 1/`reduction` scale (1, 2, 4
    or 8; see jpeg_reduction): ceil(width / reduction) x ceil(height / reduction) pixels.

    Accurate DCT and fancy upsampling (the defaults): the fast variants save under 7% of a decode
    and change the pixels. RecordError on anything libjpeg-turbo rejects, warnings included
    (strict).
    """
    width, height = size
    try:
        # The smallest M/8 scale giving at least these sizes is exactly 1/reduction.
        return simplejpeg.decode_jpeg(
            data,
            colorspace="RGB" if num_channels == 3 else "GRAY",
            min_height=-(-height // reduction),
            min_width=-(-width // reduction),
        )
    except ValueError as exc:
        raise RecordError(f"cannot decode the record's JPEG ({exc})") from exc


def _to_8_bits(image: Image.Image) -> Image.Image:
    """The image in "L" or "RGB", converted as OpenCV's imread (convert_imageset's reader) does
    without IMREAD_ANYDEPTH: 16-bit samples keep their high byte (value >> 8, libpng's strip_16;
    Pillow itself does so for 16-bit colour PNGs, but clips 16-bit gray ones to 255), alpha is
    dropped, palettes are expanded, CMYK and YCbCr become RGB."""
    if image.mode in ("L", "RGB"):
        return image
    if image.mode.startswith("I"):  # I;16 variants, and I: what Pillow < 10.4 makes of them
        high_bytes = np.clip(np.asarray(image).astype(np.int64) >> 8, 0, 255)
        return Image.fromarray(high_bytes.astype(np.uint8), "L")
    if image.mode == "F":
        raise RecordError(
            "the record's image has floating-point samples; convert_imageset's "
            "OpenCV cannot read those as 8 bits either: store 8- or 16-bit images"
        )
    return image.convert("L" if image.mode in ("1", "LA", "La") else "RGB")


def decode_image(
    record: Record, num_channels: int, draft_size: tuple[int, int] | None = None
) -> Image.Image:
    """The record's image in mode "RGB" (num_channels 3) or "L" (num_channels 1)."""
    if num_channels not in (1, 3):
        raise RecordError(f"num_channels is {num_channels}; use 1 (gray) or 3 (colour)")
    image = decode_native(record, draft_size)
    wanted = "RGB" if num_channels == 3 else "L"
    return image if image.mode == wanted else image.convert(wanted)


def serialize_record(record: Record) -> bytes:
    """The database value for `record`, laid out exactly as convert_imageset / make_image_db do."""
    if record.format == DATUM:
        return _datum_message(record).SerializeToString()
    if record.format == TENSORPROTOS:
        return _tensorprotos_message(record).SerializeToString()
    raise RecordError(f"unknown record format {record.format!r}; use one of {RECORD_FORMATS}")


def _datum_message(record: Record):
    if record.encoded is not None:  # convert_imageset sets only data, label and encoded here
        return protos.Datum(data=record.encoded, label=record.label, encoded=True)
    bgr = _bgr_to_rgb(_pixels(record))  # the swap is its own inverse
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
        bgr = _bgr_to_rgb(_pixels(record))
        height, width, channels = bgr.shape
        image.data_type = protos.BYTE
        image.dims.extend([height, width, channels] if channels == 3 else [height, width])
        image.byte_data = bgr.tobytes()
    label = message.protos.add()
    label.data_type = protos.INT32
    label.dims.append(1)
    label.int32_data.append(record.label)
    return message
