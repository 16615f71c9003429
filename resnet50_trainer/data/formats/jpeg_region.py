"""Decode only the part of a JPEG a crop needs: the box's rows and columns, at 1/1 to 1/8 DCT
scale, with libjpeg-turbo's jpeg_crop_scanline and jpeg_skip_scanlines (_jpeg_region.c).

Rows below the box are never entropy-decoded, rows above it are only entropy-decoded (no inverse
DCT, upsampling or colour conversion), and columns beside it only entropy-decoded; the box's
pixels are the full decode's, bit for bit (one extra column each side, and 3 columns at least where
chroma is subsampled horizontally and the image has them, keep the chroma upsampling at the box's
edges as in the full frame, for a box a pixel wide at the image's edge too;
tests/system/test_region_decode.py). Why our own module: no binding on PyPI reaches these calls.
simplejpeg (which we keep for headers and whole frames) and PyTurboJPEG call TurboJPEG's
whole-frame decode (PyTurboJPEG's crop is a lossless transform that re-encodes the crop, dearer
than the decode it saves); the cropping region of TurboJPEG 3 is not in Debian 12's libturbojpeg
(2.1); Pillow's draft mode scales but never crops.

A JPEG with a restart marker after every MCU (`resnet50-db create --restart_markers`,
`with_restart_markers`) is cut down to the MCUs round the box first, so the rows above the box and
the columns beside it are not even entropy-decoded: the box costs its own area, about 0.6 of a
whole decode for a random-resized crop instead of 0.8 (docs/speed.md). Same pixels, bit for bit.

Without the compiled module (no compiler or no libjpeg headers where the package was installed)
the same boxes come from simplejpeg's whole-frame decode: the same pixels, at the old speed.
"""

from __future__ import annotations

import numpy as np

from resnet50_trainer.data.formats.images import (
    decode_jpeg_reduced,
    gray_pixels,
    jpeg_header,
    record_failure,
)

try:
    from resnet50_trainer.data.formats._jpeg_region import add_restart_markers, decode_region
except ImportError:  # setup.py builds it where a compiler and libjpeg's headers are
    add_restart_markers = decode_region = None

REGION_DECODE = decode_region is not None
JPEG_END = b"\xff\xd9"  # the EOI marker, where a complete file ends (give or take padding)


def ends_complete(encoded: bytes | memoryview) -> bool:
    """Whether the file ends with the EOI marker, allowing the zero padding some writers add."""
    return bytes(encoded[-64:]).rstrip(b"\x00").endswith(JPEG_END)


def decode_jpeg_box(
    data: bytes | memoryview,
    size: tuple[int, int],
    num_channels: int,
    reduction: int,
    box: tuple[int, int, int, int],
) -> np.ndarray:
    """HWC uint8 (RGB, or its images.luma when num_channels is 1) of `box` (left, top, right,
    bottom, in the pixels of the decode at 1/reduction) of a JPEG that images.jpeg_header
    accepted, `size` being its full (width, height).

    A file cut short goes to the whole-frame decode, which sees the cut wherever it is: a region
    decode stops at the box and would never read the missing end. RecordError on anything
    libjpeg-turbo rejects, warnings included (strict)."""
    rgb = _decode_rgb_box(data, size, reduction, box)
    return rgb if num_channels == 3 else gray_pixels(rgb)


def _decode_rgb_box(
    data: bytes | memoryview,
    size: tuple[int, int],
    reduction: int,
    box: tuple[int, int, int, int],
) -> np.ndarray:
    left, top, right, bottom = box
    if decode_region is None or not ends_complete(data):
        whole = decode_jpeg_reduced(bytes(data), size, reduction)
        return whole[top:bottom, left:right]
    pixels = np.empty((bottom - top, right - left, 3), np.uint8)
    with record_failure("JPEG"):
        decode_region(data, reduction, left, top, right - left, bottom - top, 3, pixels)
    return pixels


def with_restart_markers(jpeg: bytes | memoryview) -> bytes:
    """The JPEG rewritten losslessly (its DCT coefficients copied, Huffman tables fitted) with a
    restart marker after every MCU; its EXIF, ICC and comment markers kept. Any decoder makes the
    same pixels of it. RecordError where libjpeg-turbo finds the file damaged, and for a frame
    over the pixel limit (before libjpeg-turbo allocates its coefficients); RuntimeError without
    the compiled module (REGION_DECODE false)."""
    if add_restart_markers is None:
        raise RuntimeError("restart markers need the compiled _jpeg_region module")
    jpeg_header(jpeg)
    with record_failure("JPEG for restart markers"):
        return add_restart_markers(jpeg)
