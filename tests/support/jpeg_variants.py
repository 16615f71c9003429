"""Valid but unusual JPEGs of one small photo, made here: by Pillow (always) and by libjpeg-turbo's
cjpeg (every luma sampling factor it writes, arithmetic coding; only where cjpeg is installed:
libjpeg-turbo-progs), and JPEGs no decoder here reads."""

from __future__ import annotations

import io
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from tests.support.dbfactory import smooth_pixels

HEIGHT, WIDTH = 64, 80
CJPEG = shutil.which("cjpeg")
needs_cjpeg = pytest.mark.skipif(
    CJPEG is None, reason="cjpeg is not installed (apt-get install libjpeg-turbo-progs)"
)

# Pillow's save options (and the mode it saves from) for each variant.
PILLOW_VARIANTS: dict[str, tuple[str, dict[str, object]]] = {
    "4:4:4": ("RGB", {"subsampling": 0}),
    "4:2:2": ("RGB", {"subsampling": 1}),
    "4:2:0": ("RGB", {"subsampling": 2}),
    "progressive": ("RGB", {"progressive": True}),
    "restart every row": ("RGB", {"restart_marker_rows": 1}),
    "restart every 3 MCUs": ("RGB", {"restart_marker_blocks": 3}),
    "gray": ("L", {}),
    "CMYK": ("CMYK", {}),
}
# cjpeg's switches for each: luma HxV with chroma 1x1 (libjpeg allows 10 blocks an MCU, so H x V
# up to 8), and arithmetic coding, sequential and progressive.
CJPEG_VARIANTS = {
    **{
        f"luma {h}x{v}": ["-sample", f"{h}x{v}"]
        for h in (1, 2, 3, 4)
        for v in (1, 2, 3, 4)
        if h * v <= 8 and (h, v) != (1, 1)
    },
    "arithmetic": ["-arithmetic"],
    "arithmetic progressive": ["-arithmetic", "-progressive"],
    "RGB, no transform": ["-rgb"],
}
ALL_VARIANTS = [*PILLOW_VARIANTS, *(pytest.param(n, marks=needs_cjpeg) for n in CJPEG_VARIANTS)]


def photo() -> Image.Image:
    return Image.fromarray(smooth_pixels(HEIGHT, WIDTH, seed=1))


def jpeg_variant(name: str) -> bytes:
    """The photo as the variant `name` of PILLOW_VARIANTS, CJPEG_VARIANTS or "YCCK"."""
    if name == "YCCK":  # a CMYK file's Adobe marker set to transform 2: its data read as YCCK
        data = bytearray(jpeg_variant("CMYK"))
        adobe = data.index(b"Adobe")
        data[adobe + 11] = 2
        return bytes(data)
    if name in CJPEG_VARIANTS:
        ppm = io.BytesIO()
        photo().save(ppm, "PPM")
        assert CJPEG is not None, "the test is marked needs_cjpeg"
        command = [CJPEG, *CJPEG_VARIANTS[name]]
        return subprocess.run(command, input=ppm.getvalue(), capture_output=True, check=True).stdout
    mode, options = PILLOW_VARIANTS[name]
    buffer = io.BytesIO()
    photo().convert(mode).save(buffer, "JPEG", quality=90, **options)
    return buffer.getvalue()


def with_precision(jpeg: bytes, bits: int) -> bytes:
    """The JPEG, its frame header claiming `bits` a sample (12: what no decoder here reads)."""
    data = bytearray(jpeg)
    data[data.index(b"\xff\xc0") + 4] = bits
    return bytes(data)


def pillow_pixels(jpeg: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(RGB, gray) as Pillow decodes the file: its RGB, and that RGB's "L"."""
    rgb = Image.open(io.BytesIO(jpeg)).convert("RGB")
    return np.asarray(rgb), np.asarray(rgb.convert("L"))
