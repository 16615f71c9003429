"""The region decoder (data/formats/_jpeg_region.c) on mutated JPEGs: bytes changed, the file cut,
bytes inserted; a random box, scale and channel count each. Every call must decode or raise
ValueError; a crash kills this script. Usage:
PYTHONPATH=. python scripts/fuzz_region_decode.py FOLDER_OF_JPEGS [--count 4000] [--seed 1]
"""

from __future__ import annotations

import argparse
import glob
import os
import random

import numpy as np
import simplejpeg

from resnet50_trainer.data.formats._jpeg_region import decode_region


def mutated(data: bytes, rng: random.Random) -> bytes:
    changed = bytearray(data)
    kind = rng.random()
    if kind < 0.4:
        for _ in range(rng.randint(1, 8)):
            changed[rng.randrange(len(changed))] = rng.randrange(256)
    elif kind < 0.7:
        del changed[rng.randrange(len(changed)) :]
    else:
        at = rng.randrange(len(changed))
        changed[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    return bytes(changed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    paths = sorted(glob.glob(os.path.join(args.folder, "**", "*.jpg"), recursive=True))[:40]
    if not paths:
        raise SystemExit(f"no .jpg files under {args.folder}")
    originals = []
    for path in paths:
        with open(path, "rb") as file:
            originals.append(file.read())
    rng = random.Random(args.seed)
    decoded = refused = 0
    for _ in range(args.count):
        original = rng.choice(originals)
        height, width = simplejpeg.decode_jpeg_header(original)[:2]
        reduction = rng.choice([1, 2, 4, 8])
        columns, rows = -(-width // reduction), -(-height // reduction)
        box_w, box_h = rng.randint(1, columns), rng.randint(1, rows)
        left, top = rng.randint(0, columns - box_w), rng.randint(0, rows - box_h)
        channels = rng.choice([1, 3])
        out = np.empty((box_h, box_w, channels), np.uint8)
        try:
            decode_region(mutated(original, rng), reduction, left, top, box_w, box_h, channels, out)
            decoded += 1
        except ValueError:
            refused += 1
    print(f"decoded {decoded}, refused {refused}")


if __name__ == "__main__":
    main()
