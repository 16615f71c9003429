"""ImageNet-like JPEGs for the benchmarks: about 500x375 (some portrait), quality 90, rich content;
or (`--photos DIR`) cut from real photographs.

Flat colours decode unrealistically fast, so each image is a scene of textured shapes: a lit
background of low-frequency waves, 30 ellipses and boxes with their own colours, stripes and
grain, and sensor-like noise, which compresses to about 90 KB a file (ImageNet averages about
110 KB).
Synthetic scenes are entropy-heavy: the Huffman decoding is about three quarters of their decode,
against about half for photographs, so what a decoder saves by skipping pixels is understated on
them. `build(photos=DIR)` makes the set from the photographs in DIR instead
(benchmarks/fetch_photos.sh gathers eight from the scikit-image and scikit-learn wheels): each
image a random window of one photo (55-100% of the largest window of its shape), resized with
Lanczos to 360-460 pixels wide and 0.7-0.8 of that high (a fifth portrait; mean about 389x329,
near the 410x308 photos that set the input goals), quality 90. Most windows shrink; those of the
smaller photos grow, which smooths them. The set is kept in --out by its count: remove it to cut
one from other photographs.
The same images are written as files in class folders (what torchvision's ImageFolder reads) and
as an LMDB of Caffe Datum records holding the same bytes (what the trainer reads).
`with_restart_markers` copies a set with every JPEG given a restart marker after every MCU, as
`resnet50-db create --restart_markers` writes them (the same pixels).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable

import numpy as np
from PIL import Image

from resnet50_trainer.data.formats.records import DATUM, Record, serialize_record
from resnet50_trainer.data.formats.writers import open_writer

JPEG_QUALITY = 90
NUM_CLASSES = 10


def make_photo(rng: np.random.Generator, width: int, height: int) -> np.ndarray:
    """HxWx3 uint8 scene of textured shapes."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    image = np.empty((height, width, 3), np.float32)
    image[:] = rng.uniform(50, 200, 3)
    for _ in range(4):
        frequency = rng.uniform(0.002, 0.03, 2)
        wave = np.sin(frequency[0] * x + frequency[1] * y + rng.uniform(0, 6.3))
        image += wave[:, :, None] * rng.uniform(-30, 30, 3)
    for _ in range(30):
        cx, cy = rng.uniform(0, width), rng.uniform(0, height)
        rx, ry = rng.uniform(8, width / 4), rng.uniform(8, height / 4)
        x0, x1 = int(max(0, cx - rx)), int(min(width, cx + rx + 1))
        y0, y1 = int(max(0, cy - ry)), int(min(height, cy + ry + 1))
        if x0 >= x1 or y0 >= y1:
            continue
        bx, by = x[y0:y1, x0:x1], y[y0:y1, x0:x1]
        inside = (
            (((bx - cx) / rx) ** 2 + ((by - cy) / ry) ** 2 <= 1)
            if rng.random() < 0.6
            else np.ones_like(bx, dtype=bool)
        )
        period, angle = rng.uniform(3, 25), rng.uniform(0, np.pi)
        stripes = np.sin((np.cos(angle) * bx + np.sin(angle) * by) * 2 * np.pi / period)
        patch = rng.uniform(0, 255, 3) + stripes[:, :, None] * rng.uniform(5, 45)
        patch = patch + rng.normal(0, rng.uniform(2, 14), patch.shape)
        region = image[y0:y1, x0:x1]
        region[inside] = patch[inside]
    image += rng.normal(0, 7, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def jpeg_bytes(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


def photo_window(rng: np.random.Generator, photo: Image.Image) -> np.ndarray:
    """HxWx3 uint8: a random window of `photo` resized to about 410x308 (a fifth portrait)."""
    width = int(rng.integers(360, 461))
    height = int(round(width * rng.uniform(0.7, 0.8)))
    if rng.random() < 0.2:
        width, height = height, width
    scale = min(photo.width / width, photo.height / height) * rng.uniform(0.55, 1.0)
    box_w, box_h = min(photo.width, width * scale), min(photo.height, height * scale)
    left, top = rng.uniform(0, photo.width - box_w), rng.uniform(0, photo.height - box_h)
    window = photo.resize(
        (width, height), Image.Resampling.LANCZOS, (left, top, left + box_w, top + box_h)
    )
    return np.asarray(window)


def photo_source(folder: str) -> Callable[[np.random.Generator, int], np.ndarray]:
    """The images of a set cut from the photographs in `folder`, taken in turn."""
    names = sorted(os.listdir(folder))
    photos = [Image.open(os.path.join(folder, name)).convert("RGB") for name in names]
    if not photos:
        raise SystemExit(f"bench_data: no photographs in {folder} (benchmarks/fetch_photos.sh)")
    return lambda rng, index: photo_window(rng, photos[index % len(photos)])


def scene_source(rng: np.random.Generator, index: int) -> np.ndarray:
    width, height = int(rng.integers(470, 520)), int(rng.integers(340, 390))
    if rng.random() < 0.2:
        width, height = height, width
    return make_photo(rng, width, height)


def read_jpegs(root: str, images: int) -> list[bytes]:
    """The first `images` files under `root` (a set's class folders), in os.walk's order."""
    jpegs = []
    for folder, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(folder, name), "rb") as file:
                jpegs.append(file.read())
    return jpegs[:images]


def set_paths(out_dir: str, count: int, photos: bool) -> tuple[str, str]:
    """(folder root, LMDB path) of the set `build` makes in `out_dir`."""
    name = f"photos_{count}" if photos else str(count)
    return os.path.join(out_dir, f"files_{name}"), os.path.join(out_dir, f"lmdb_{name}")


def build(out_dir: str, count: int, seed: int = 0, photos: str = "") -> tuple[str, str]:
    """(folder root, LMDB path) holding `count` images, synthetic scenes or (`photos`, a folder)
    windows of photographs; reused if already built with that count and source."""
    folders, lmdb_path = set_paths(out_dir, count, bool(photos))
    if os.path.isdir(folders) and os.path.isdir(lmdb_path):
        return folders, lmdb_path
    rng = np.random.default_rng(seed)
    source = photo_source(photos) if photos else scene_source
    files = []
    for index in range(count):
        label = index % NUM_CLASSES
        data = jpeg_bytes(source(rng, index))
        folder = os.path.join(folders, f"class_{label}")
        os.makedirs(folder, exist_ok=True)
        name = f"img_{index:06d}.jpg"
        with open(os.path.join(folder, name), "wb") as file:
            file.write(data)
        files.append((f"{index:08d}_class_{label}/{name}".encode(), label, data))
    with open_writer(lmdb_path, "lmdb") as writer:
        for key, label, data in files:
            writer.put(key, serialize_record(Record(label, data, None, DATUM)))
    return folders, lmdb_path


def with_restart_markers(folders: str, lmdb_path: str) -> tuple[str, str]:
    """(folder root, LMDB path) of the set's copy (`<name>_markers`, beside it, made once) whose
    JPEGs carry a restart marker after every MCU, losslessly."""
    from resnet50_trainer.data.formats.jpeg_region import with_restart_markers as rewrite
    from resnet50_trainer.tools.db.build import copy_database
    from resnet50_trainer.tools.db.sources import CreateOptions

    marked_folders, marked_lmdb = f"{folders}_markers", f"{lmdb_path}_markers"
    if os.path.isdir(marked_folders) and os.path.isdir(marked_lmdb):
        return marked_folders, marked_lmdb
    for root, _, names in os.walk(folders):
        target = os.path.join(marked_folders, os.path.relpath(root, folders))
        os.makedirs(target, exist_ok=True)
        for name in names:
            with open(os.path.join(root, name), "rb") as file:
                data = rewrite(file.read())
            with open(os.path.join(target, name), "wb") as file:
                file.write(data)
    copy_database(lmdb_path, CreateOptions(db_path=marked_lmdb, restart_markers=True))
    return marked_folders, marked_lmdb


def describe(folders: str) -> str:
    paths = [os.path.join(root, name) for root, _, names in os.walk(folders) for name in names]
    sizes = [os.path.getsize(path) for path in paths]
    shapes = np.array([Image.open(path).size for path in paths])
    width, height = shapes.mean(axis=0)
    return (
        f"{len(sizes)} JPEGs, mean {width:.0f}x{height:.0f}, {np.mean(sizes) / 1024:.0f} KB,"
        f" quality {JPEG_QUALITY}"
    )


def leveldb_copy(lmdb_path: str) -> str:
    """A LevelDB holding the LMDB's records (beside it, `leveldb_<count>`), made once."""
    from resnet50_trainer.data.formats.databases import open_database

    folder, name = os.path.split(lmdb_path)
    path = os.path.join(folder, name.replace("lmdb_", "leveldb_", 1))
    if not os.path.isdir(path):
        with open_database(lmdb_path, "lmdb") as source, open_writer(path, "leveldb") as writer:
            for key, value in source.items():
                writer.put(key, bytes(value))
    return path
