"""Build an ImageNet-scale DB cheaply, to measure start-up and preflight at that scale.

N records of a tiny JPEG each (a few distinct 8 px images), keys shaped like convert_imageset's
("%08d_n01440764/n01440764_10026.JPEG", 39 bytes), labels i % --labels. --record_bytes pads each
JPEG with comment segments of random bytes (decoders skip them; LevelDB cannot compress them) to
about that size: 50,000 records of 120,000 bytes make a test DB of ImageNet's size (~6 GB) with
almost no encoding work.

Usage: python -m benchmarks.make_scale_db OUT --records 1281167 [--record_bytes 120000]
       [--db_type lmdb|leveldb] [--format datum|tensorprotos] [--labels 1000]
"""

from __future__ import annotations

import argparse
import io

import numpy as np
from PIL import Image

from resnet50_trainer.data.formats.db_types import DB_TYPES, LMDB
from resnet50_trainer.data.formats.records import DATUM, RECORD_FORMATS, Record, serialize_record
from resnet50_trainer.data.formats.writers import open_writer

DISTINCT_IMAGES = 16
_COMMENT_MARKER = b"\xff\xfe"
_LARGEST_COMMENT = 65533  # a segment's 2-byte length counts itself


def tiny_jpegs(count: int, size: int = 8) -> list[bytes]:
    rng = np.random.default_rng(0)
    jpegs = []
    for _ in range(count):
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, "JPEG", quality=90)
        jpegs.append(buffer.getvalue())
    return jpegs


def padded(jpeg: bytes, record_bytes: int) -> bytes:
    """`jpeg` with comment segments after its SOI marker, to about `record_bytes` in all."""
    segments = []
    missing = record_bytes - len(jpeg)
    # Random bytes, as incompressible as a photo's: LevelDB compresses its blocks.
    noise = np.random.default_rng(len(jpeg))
    while missing > 4:
        payload = min(missing - 4, _LARGEST_COMMENT)
        segments.append(_COMMENT_MARKER + (payload + 2).to_bytes(2, "big") + noise.bytes(payload))
        missing -= payload + 4
    return jpeg[:2] + b"".join(segments) + jpeg[2:]


def scale_key(index: int, labels: int) -> bytes:
    synset = f"n{index % labels:08d}"
    return f"{index:08d}_{synset}/{synset}_{index:05d}.JPEG".encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="new database directory")
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--record_bytes", type=int, default=0, help="pad each JPEG to this size")
    parser.add_argument("--db_type", choices=DB_TYPES, default=LMDB)
    parser.add_argument("--format", choices=RECORD_FORMATS, default=DATUM)
    parser.add_argument("--labels", type=int, default=1000)
    args = parser.parse_args()
    jpegs = [padded(jpeg, args.record_bytes) for jpeg in tiny_jpegs(DISTINCT_IMAGES)]
    with open_writer(args.out, args.db_type) as writer:
        for index in range(args.records):
            label = index % args.labels
            record = Record(label, jpegs[index % DISTINCT_IMAGES], None, args.format)
            writer.put(scale_key(index, args.labels), serialize_record(record))


if __name__ == "__main__":
    main()
