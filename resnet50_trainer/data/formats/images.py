"""A record's image decoded as the trainer sees it: encoded files by Pillow, or JPEGs by libjpeg-
turbo at a reduced DCT scale where the crop allows, raw pixels from BGR; the JPEG frame header read
without decoding; 8 bits per sample; gray as one definition (`luma`); the pixel limit.

Whatever a decoder raises on one record's bytes is that record's RecordError, and what its
libraries print meanwhile goes unseen: a bad record is one line, said by whoever reads it."""

from __future__ import annotations

import contextlib
import io
import os
import sys
import warnings
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import simplejpeg
from PIL import Image, UnidentifiedImageError

from resnet50_trainer.data.formats.records import Record
from resnet50_trainer.errors import RecordError

# The most pixels (width x height) an image may claim, checked from its header before any decoder
# allocates one: what Pillow itself refuses as a decompression bomb (twice its default
# Image.MAX_IMAGE_PIXELS), in every command (docs/data.md, "Which images decode").
MAX_PIXELS = 178_956_970

_NO_FORMAT = "the record's image bytes are in no format Pillow can read"
# Frame (SOFn) markers: 0xC0-0xCF but DHT (C4), JPG (C8) and DAC (CC), which are none.
_FRAME_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# The frames libjpeg-turbo decodes as they are: DCT-based, sequential or progressive (not lossless
# or hierarchical), Huffman-coded (which nvJPEG decodes too) or arithmetic-coded.
_HUFFMAN_FRAMES, _ARITHMETIC_FRAMES = frozenset({0xC0, 0xC1, 0xC2}), frozenset({0xC9, 0xCA})
_MARKERS_WITHOUT_LENGTH = frozenset({0x01, *range(0xD0, 0xD8)})  # TEM, RST0-7
_START_OF_SCAN, _END_OF_IMAGE = 0xDA, 0xD9


class JpegFrame(NamedTuple):
    """A JPEG that libjpeg-turbo decodes as it is (jpeg_header)."""

    width: int
    height: int
    arithmetic: bool  # arithmetic-coded: libjpeg-turbo decodes it, nvJPEG does not

    @property
    def size(self) -> tuple[int, int]:
        return self.width, self.height


def _file_bytes(record: Record) -> bytes | memoryview:
    """The encoded file of a record without pixels (a Record holds exactly one of the two)."""
    assert record.encoded is not None, "a Record holds either encoded bytes or pixels"
    return record.encoded


# The files whose library writes to stderr itself: libtiff, a line for each fault it meets.
_TIFF_MAGIC = (b"II*\x00", b"MM\x00*", b"II+\x00", b"MM\x00+")


@contextlib.contextmanager
def library_noise_silenced(data: bytes | memoryview) -> Iterator[None]:
    """Python warnings unseen while `data` is decoded, and for a TIFF what libtiff writes to
    stderr (only then: stderr is the process's, and another thread's line must not be lost)."""
    quiet = _stderr_to_null() if bytes(data[:4]) in _TIFF_MAGIC else contextlib.nullcontext()
    with warnings.catch_warnings(), quiet:
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def _stderr_to_null() -> Iterator[None]:
    """File descriptor 2 on /dev/null meanwhile. It is the process's: another thread's writes in
    the same moment are lost too, so this wraps one decode, not more."""
    if sys.stderr is not None:
        sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr: nothing to keep quiet
        yield
        return
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@contextlib.contextmanager
def record_failure(what: str) -> Iterator[None]:
    """Whatever a decoder raises on the record's bytes becomes its RecordError ("cannot decode the
    record's `what`")."""
    try:
        yield
    except RecordError:
        raise
    except Exception as exc:  # noqa: BLE001 - decoders of hostile bytes raise any kind of error
        raise RecordError(f"cannot decode the record's {what} ({_reason(exc)})") from exc


def _reason(exc: Exception) -> str:
    """An exception in a few words on one line: its message's first line, or its type's name."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _check_pixels(width: int, height: int) -> None:
    if width * height > MAX_PIXELS:
        raise _too_many_pixels(f"{width}x{height}")


def _too_many_pixels(claimed: str) -> RecordError:
    return RecordError(
        f"the record's image claims {claimed} pixels, over the limit of {MAX_PIXELS:,} "
        "(a decompression bomb, or an image to store smaller)"
    )


def _opened(data: bytes | memoryview) -> Image.Image:
    """The file opened by Pillow (its header read, no pixel decoded), within the pixel limit; a
    JPEG's frame judged first, as jpeg_header judges it."""
    jpeg_header(data)
    try:
        image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError as exc:
        raise RecordError(_NO_FORMAT) from exc
    except Image.DecompressionBombError as exc:  # Pillow's own check, before ours can look
        raise _too_many_pixels("too many") from exc
    _check_pixels(*image.size)
    return image


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
    data = _file_bytes(record)
    with record_failure("image bytes"), library_noise_silenced(data):
        image = _opened(data)
        if draft_size is not None and image.format == "JPEG":
            image.draft(None, draft_size)  # None keeps the colour mode: only the scale changes
        image.load()  # decode now, so a truncated file fails here and not in a later transform
        return _to_8_bits(image)


def encoded_format(data: bytes | memoryview) -> str:
    """Pillow's name for the file format of `data` ("JPEG", "PNG", ...), read from its header;
    RecordError for no image, and one over the pixel limit."""
    with record_failure("image bytes"), library_noise_silenced(data):
        file_format = _opened(data).format
    # Pillow names the format of every file it opens (None is for images it made itself).
    if file_format is None:
        raise RecordError(_NO_FORMAT)
    return file_format


def jpeg_header(data: bytes | memoryview | None) -> JpegFrame | None:
    """The frame of a JPEG that libjpeg-turbo decodes as it is (gray or colour, 8 bits, DCT-based,
    sequential or progressive, Huffman or arithmetic, any sampling factors), read from its header;
    None for anything else (CMYK and YCCK, lossless, another format, a header cut short, no file
    bytes), which Pillow then gets to judge. RecordError for a frame over the pixel limit, and
    for samples of other than 8 bits, which no decoder here reads."""
    header = None if data is None else _frame_header(data)
    if header is None:
        return None
    marker, precision, height, width, components = header
    _check_pixels(width, height)
    if precision != 8:
        raise RecordError(f"the record's JPEG has {precision}-bit samples; only 8-bit are decoded")
    direct = marker in _HUFFMAN_FRAMES | _ARITHMETIC_FRAMES and components in (1, 3)
    if not direct or width == 0 or height == 0:  # a height of 0: set later, by a DNL marker
        return None
    return JpegFrame(width, height, marker in _ARITHMETIC_FRAMES)


def _frame_header(data: bytes | memoryview) -> tuple[int, int, int, int, int] | None:
    """(marker, precision, height, width, components) of the JPEG's frame header, found by
    walking its marker segments; None for no JPEG, or one that ends or turns odd before it."""
    if bytes(data[:2]) != b"\xff\xd8":
        return None
    position = 2
    while position + 4 <= len(data):
        if data[position] != 0xFF:
            return None  # bytes between segments: libjpeg may read past them, Pillow judges
        marker = data[position + 1]
        if marker == 0xFF or marker in _MARKERS_WITHOUT_LENGTH:  # a fill byte, or no segment
            position += 1 if marker == 0xFF else 2
            continue
        if marker in (_START_OF_SCAN, _END_OF_IMAGE):
            return None
        length = int.from_bytes(data[position + 2 : position + 4], "big")
        if length < 2:
            return None
        if marker in _FRAME_MARKERS:
            fields = bytes(data[position + 4 : position + 10])
            if length < 8 or len(fields) < 6:
                return None
            return (
                marker,
                fields[0],
                int.from_bytes(fields[1:3], "big"),
                int.from_bytes(fields[3:5], "big"),
                fields[5],
            )
        position += 2 + length
    return None


def jpeg_reduction(shorter_side: int, min_side: int) -> int:
    """The largest of 8, 4 and 2 that leaves `shorter_side` / it at least `min_side`, else 1: the
    JPEG decode's reduction for an image (or a crop's box) that must keep that many pixels.

    Only powers of two: libjpeg-turbo's scaled IDCTs for 3/8, 5/8, 6/8 and 7/8 have no SIMD code
    and cost more than a full-size decode (docs/speed.md, "JPEG DCT scaling and fast modes")."""
    return next((factor for factor in (8, 4, 2) if shorter_side >= factor * min_side), 1)


def decode_jpeg_reduced(data: bytes, size: tuple[int, int], reduction: int) -> np.ndarray:
    """HWC uint8 RGB of a JPEG that jpeg_header accepted, `size` being its (width, height),
    decoded by libjpeg-turbo at 1/`reduction` scale (1, 2, 4 or 8; see jpeg_reduction):
    ceil(width / reduction) x ceil(height / reduction) pixels.

    Accurate DCT and fancy upsampling (the defaults): the fast variants save under 7% of a decode
    and change the pixels. RecordError on anything libjpeg-turbo rejects, warnings included
    (strict).
    """
    width, height = size
    with record_failure("JPEG"):
        # The smallest M/8 scale giving at least these sizes is exactly 1/reduction.
        return simplejpeg.decode_jpeg(
            data, min_height=-(-height // reduction), min_width=-(-width // reduction)
        )


def luma(red, green, blue):
    """Gray of RGB samples (integer tensors or arrays of 32 bits or more): ITU-R 601-2 luma in
    Pillow's fixed point, what its convert("L") computes. The one gray of every path (gray_pixels,
    with_channels; not libjpeg's or nvJPEG's Y, up to 14 levels off), so --num_channels 1 trains
    on what dump writes."""
    return (red * 19595 + green * 38470 + blue * 7471 + 0x8000) >> 16


def gray_pixels(rgb: np.ndarray) -> np.ndarray:
    """HW1 uint8 luma of HWC uint8 RGB pixels (writable, as torch wants), by Pillow's
    convert("L"): `luma` to the bit, in C (half the time of numpy's integer arithmetic)."""
    return np.array(Image.fromarray(rgb, "RGB").convert("L"))[:, :, None]


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
    return with_channels(decode_native(record, draft_size), num_channels)


def with_channels(image: Image.Image, num_channels: int) -> Image.Image:
    """An "L" or "RGB" image in mode "RGB" (num_channels 3: gray three times) or "L" (1: luma)."""
    if num_channels == 3:
        return image if image.mode == "RGB" else image.convert("RGB")
    return image if image.mode == "L" else image.convert("L")  # luma: see gray_pixels
