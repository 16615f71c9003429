"""Build sample_data/: small LMDB and LevelDB databases of generated images, 10 classes.

Each class is a colour and a stripe orientation: a striped patch of random position, size, stripe
period and phase over a noisy background, with colour jitter. Colour alone leaves pairs of classes
apart only by orientation, so a model must see the shape too; at 32 px the stripes stay visible.

Deterministic: fixed seeds and `resnet50-db create`'s reproducible writers give byte-identical
files on every run (with the same Pillow/libjpeg). Usage: python scripts/make_sample_data.py [OUT]
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np
from PIL import Image

from resnet50_trainer.tools.db.build import create_database
from resnet50_trainer.tools.db.sources import CreateOptions

COLOURS = {
    "red": (200, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 70, 200),
    "yellow": (210, 190, 40),
    "magenta": (190, 50, 180),
}
ORIENTATIONS = ("horizontal", "vertical")
CLASS_NAMES = [f"{colour}_{orientation}" for colour in COLOURS for orientation in ORIENTATIONS]
IMAGE_SIZE = 64
SPLITS = {"train": (80, 1), "test": (20, 2)}  # images per class, seed
JPEG_QUALITY = 75


def make_image(colour: str, orientation: str, rng: np.random.Generator) -> Image.Image:
    size = IMAGE_SIZE
    # background: a smooth random tint plus mild pixel noise
    image = np.empty((size, size, 3), dtype=np.float32)
    image[:] = rng.uniform(60, 160, 3)
    image += rng.normal(0, 12, (size, size, 3))
    # the striped patch
    height, width = rng.integers(size // 2, size - 4, 2)
    top, left = rng.integers(0, size - height + 1), rng.integers(0, size - width + 1)
    period = int(rng.integers(8, 15))
    phase = int(rng.integers(0, period))
    rows, columns = np.mgrid[0:height, 0:width]
    along = rows if orientation == "horizontal" else columns
    stripe = ((along + phase) % period) < period // 2
    base = np.array(COLOURS[colour], dtype=np.float32) + rng.normal(0, 15, 3)
    patch = np.where(stripe[:, :, None], base, base * 0.35)
    image[top : top + height, left : left + width] = patch + rng.normal(0, 6, (height, width, 3))
    return Image.fromarray(np.clip(np.rint(image), 0, 255).astype(np.uint8))


def write_images(folder: str, per_class: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for class_name in CLASS_NAMES:
        colour, orientation = class_name.split("_")
        os.makedirs(os.path.join(folder, class_name))
        for index in range(per_class):
            path = os.path.join(folder, class_name, f"{index:04d}.jpg")
            make_image(colour, orientation, rng).save(path, "JPEG", quality=JPEG_QUALITY)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="sample_data")
    out = parser.parse_args().out
    os.makedirs(out, exist_ok=True)
    with tempfile.TemporaryDirectory() as images:
        for split, (per_class, seed) in SPLITS.items():
            source = os.path.join(images, split)
            write_images(source, per_class, seed)
            for db_type in ("lmdb", "leveldb"):
                summary = create_database(
                    CreateOptions(
                        db_path=os.path.join(out, f"{split}_{db_type}"),
                        source=source,
                        db_type=db_type,
                        overwrite=True,
                    )
                )
                print(f"{summary.db_path}: {summary.written} records")


if __name__ == "__main__":
    main()
