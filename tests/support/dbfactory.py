"""Small databases for tests, written the way the original tools write them.

Records are built field by field as convert_imageset (Datum), make_image_db (TensorProtos STRING /
BYTE) and lmdb_create_example.py (TensorProtos FLOAT, CHW) build them, and stored with lmdb/plyvel
directly, independently of resnet50_trainer's own writer. Pixels are given HxWxC uint8 in RGB;
the helpers store them in BGR as those tools do.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys

import lmdb
import numpy as np
import plyvel
from PIL import Image

from resnet50_trainer.data.formats import protos
from resnet50_trainer.data.formats.records import Record


def random_pixels(height: int, width: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    """HxWxC uint8 noise, RGB (or gray when channels is 1)."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)


def smooth_pixels(height: int, width: int, channels: int = 3, seed: int = 0) -> np.ndarray:
    """HxWxC uint8 gradients plus a little noise: compresses like a photo, unlike pure noise."""
    rows, columns = np.mgrid[0:height, 0:width]
    planes = [
        rows * 255 // max(1, height - 1),
        columns * 255 // max(1, width - 1),
        (rows + columns) * 127 // max(1, height + width - 2),
    ]
    base = np.stack(planes, axis=2)[:, :, :channels]
    noise = np.random.default_rng(seed).integers(-8, 9, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def encode_image(pixels: np.ndarray, image_format: str = "JPEG", quality: int = 90) -> bytes:
    """File bytes of HxWxC uint8 pixels (RGB or one channel) in `image_format`."""
    image = Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels)
    buffer = io.BytesIO()
    image.save(buffer, image_format, **({"quality": quality} if image_format == "JPEG" else {}))
    return buffer.getvalue()


def make_jpeg(
    height: int = 32, width: int = 48, channels: int = 3, seed: int = 0, quality: int = 90
) -> bytes:
    return encode_image(smooth_pixels(height, width, channels, seed), "JPEG", quality)


def make_undecodable_jpeg(height: int = 48, width: int = 56, seed: int = 0) -> bytes:
    """A complete JPEG whose header reads but whose decode fails (libjpeg-turbo and nvJPEG alike):
    its first component names quantisation table 3, which the file does not define."""
    data = bytearray(make_jpeg(height, width, seed=seed))
    frame = data.find(b"\xff\xc0")  # SOF0: length, precision, height, width, count, components
    data[frame + 12] = 3  # the first component's table selector
    return bytes(data)


def datum_record(
    label: int,
    pixels: np.ndarray | None = None,
    encoded: bytes | None = None,
    as_float: bool = False,
) -> bytes:
    """A Datum: encoded -> data + label + encoded=true (convert_imageset keeping the file);
    pixels -> channels/height/width + CHW BGR bytes in data (or float_data when as_float)."""
    datum = protos.Datum()
    if encoded is not None:
        datum.data = encoded
        datum.label = label
        datum.encoded = True
        return datum.SerializeToString()
    if pixels is None:
        raise TypeError("datum_record needs pixels or encoded")
    height, width, channels = pixels.shape
    chw_bgr = pixels[:, :, ::-1].transpose(2, 0, 1)
    datum.channels = channels
    datum.height = height
    datum.width = width
    if as_float:
        datum.float_data.extend(chw_bgr.astype(np.float32).ravel().tolist())
    else:
        datum.data = chw_bgr.tobytes()
    datum.label = label
    return datum.SerializeToString()


def tensorprotos_record(
    label: int,
    pixels: np.ndarray | None = None,
    encoded: bytes | None = None,
    as_float: bool = False,
    bbox: list[int] | None = None,
) -> bytes:
    """TensorProtos [image, INT32 label(, INT32 bbox)]: encoded -> STRING, dims [1] (make_image_db);
    pixels -> BYTE HWC BGR, dims [H, W, 3] or [H, W] for gray (make_image_db --raw);
    as_float -> FLOAT CHW BGR, dims [C, H, W] (lmdb_create_example.py)."""
    message = protos.TensorProtos()
    image = message.protos.add()
    if encoded is not None:
        image.dims.append(1)
        image.data_type = protos.STRING
        image.string_data.append(encoded)
    elif pixels is None:
        raise TypeError("tensorprotos_record needs pixels or encoded")
    elif as_float:
        chw_bgr = pixels[:, :, ::-1].transpose(2, 0, 1)
        image.dims.extend(chw_bgr.shape)
        image.data_type = protos.FLOAT
        image.float_data.extend(chw_bgr.astype(np.float32).ravel().tolist())
    else:
        height, width, channels = pixels.shape
        image.dims.extend([height, width, channels] if channels == 3 else [height, width])
        image.data_type = protos.BYTE
        image.byte_data = pixels[:, :, ::-1].tobytes()
    for values in ([label], bbox):
        if values is not None:
            tensor = message.protos.add()
            tensor.dims.append(len(values))
            tensor.data_type = protos.INT32
            tensor.int32_data.extend(values)
    return message.SerializeToString()


def write_db(path: str, db_type: str, records: list[tuple[bytes, bytes]]) -> str:
    """Store (key, value) pairs in a new LMDB or LevelDB directory at `path`; returns path."""
    if db_type == "lmdb":
        env = lmdb.open(path, map_size=64 << 20, subdir=True)
        with env.begin(write=True) as txn:
            for key, value in records:
                txn.put(key, value)
        env.close()
    elif db_type == "leveldb":
        db = plyvel.DB(path, create_if_missing=True, error_if_exists=True)
        with db.write_batch() as batch:
            for key, value in records:
                batch.put(key, value)
        db.close()
    else:
        raise ValueError(f"db_type must be lmdb or leveldb, not {db_type!r}")
    return path


def caffe_key(index: int, relative_path: str) -> bytes:
    """The key convert_imageset and make_image_db write."""
    return f"{index:08d}_{relative_path}".encode()


def write_class_folders(
    root: str, class_count: int = 2, per_class: int = 3, size: int = 32, image_format: str = "JPEG"
) -> list[np.ndarray]:
    """root/class_<k>/img_<i>.<ext> images; returns their pixels in the sorted order `create`
    reads them (class by class, file names sorted)."""
    extension = {"JPEG": "jpg", "PNG": "png"}[image_format]
    written = []
    for label in range(class_count):
        folder = os.path.join(root, f"class_{label}")
        os.makedirs(folder, exist_ok=True)
        for index in range(per_class):
            pixels = smooth_pixels(size, size + 8, 3, seed=label * 100 + index)
            with open(os.path.join(folder, f"img_{index}.{extension}"), "wb") as file:
                file.write(encode_image(pixels, image_format))
            written.append(pixels)
    return written


def write_image_db(
    path: str,
    num_records: int,
    num_labels: int,
    db_type: str = "lmdb",
    height: int = 40,
    width: int = 48,
) -> str:
    """JPEG Datum records; record i has label i % num_labels and key "%08d_img{i}.jpg"."""
    records = [
        (
            caffe_key(i, f"img{i}.jpg"),
            datum_record(i % num_labels, encoded=make_jpeg(height, width, seed=i)),
        )
        for i in range(num_records)
    ]
    return write_db(path, db_type, records)


def cut_short(lmdb_path: str, share: float = 1 / 3) -> str:
    """An LMDB whose data.mdb is cut to `share` of its length, as a copy stopped part way or a
    full disk leaves it; returns the path."""
    data = os.path.join(lmdb_path, "data.mdb")
    os.truncate(data, int(os.path.getsize(data) * share))
    return lmdb_path


# Another process's writer as LMDB's own tools write (lmdb.open's lock=True: lock.mdb, with its
# reader table): each transaction sets every value to one byte repeated, the next byte each time;
# four transactions a line read on stdin, or one after another until killed with "nonstop".
_LIVE_WRITER = r"""
import sys
import lmdb

path, count, nonstop = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "nonstop"
environment = lmdb.open(path, map_size=1 << 28)
byte = 0


def fill():
    with environment.begin(write=True) as transaction:
        for index in range(count):
            transaction.put(b"%05d" % index, bytes([byte]) * LIVE_VALUE_SIZE)


fill()
print("ready", flush=True)
while nonstop or sys.stdin.readline():
    for _ in range(4):
        byte = (byte + 1) % 256
        fill()
    if not nonstop:
        print(byte, flush=True)
"""
LIVE_VALUE_SIZE = 3000


class LiveLmdbWriter:
    """An LMDB at `path` that another process writes while the test reads it: its `count` values
    all `byte` (a byte repeated LIVE_VALUE_SIZE times), rewritten four times by `rewrite()`, or
    nonstop."""

    def __init__(self, path: str, count: int, nonstop: bool = False) -> None:
        script = f"LIVE_VALUE_SIZE = {LIVE_VALUE_SIZE}\n{_LIVE_WRITER}"
        self._process = subprocess.Popen(
            [sys.executable, "-c", script, path, str(count), "nonstop" if nonstop else "asked"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None and self._process.stdin is not None
        self._stdin, self._stdout = self._process.stdin, self._process.stdout
        assert self._stdout.readline() == "ready\n"
        self.byte = 0

    def rewrite(self) -> None:
        self._stdin.write("again\n")
        self._stdin.flush()
        self.byte = int(self._stdout.readline())

    def __enter__(self) -> LiveLmdbWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self._process.kill()
        self._process.wait()
        self._stdin.close()
        self._stdout.close()


def encoded_of(record: Record) -> bytes:
    """The file bytes an encoded record holds (a view into a database's memory copied out)."""
    if record.encoded is None:
        raise AssertionError(f"a record of {record.format} holds pixels, not file bytes")
    return bytes(record.encoded)


def pixels_of(record: Record) -> np.ndarray:
    """The pixels a raw (not encoded) record holds."""
    if record.pixels is None:
        raise AssertionError(f"a record of {record.format} holds file bytes, not pixels")
    return record.pixels
