"""`resnet50-db dump`: one record's image, exactly as the trainer's decoder sees it."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from PIL import Image

from resnet50_trainer.config.values import path_value
from resnet50_trainer.data.formats.databases import open_database
from resnet50_trainer.data.formats.images import decode_image
from resnet50_trainer.data.formats.keys import printable_key
from resnet50_trainer.data.formats.records import parse_record
from resnet50_trainer.errors import RecordError, UserError
from resnet50_trainer.path_words import shown
from resnet50_trainer.tools.db.arguments import add_database_arguments
from resnet50_trainer.tools.output_file import replacing

HELP = "write one record's decoded image"
DESCRIPTION = (
    "Write a record's image as the trainer decodes it (before augmentation) and print its label."
)


def dump_record(
    path: str, db_type: str, out: str, which: int | bytes, num_channels: int = 3
) -> tuple[bytes, int]:
    """Write the record `which` names to `out`: a position in key order (negative: from the end,
    as Python counts) or a key; (key, label)."""
    with open_database(path, db_type) as database:
        key = _key_at(database.keys(), which, path) if isinstance(which, int) else which
        value = database.get(key)
    try:
        record = parse_record(value)
        image = decode_image(record, num_channels)
    except RecordError as error:
        raise RecordError(f"record {printable_key(key)}: {error}") from error
    image_format = Image.registered_extensions().get(os.path.splitext(out)[1].lower())
    if image_format is None:
        raise UserError(f"cannot write {shown(out)}: use a path ending in .png")
    with replacing(out, "--out", "room for the image") as partial:
        image.save(partial, format=image_format)
    return key, record.label


def _key_at(keys: Sequence[bytes], index: int, path: str) -> bytes:
    count = len(keys)
    if not -count <= index < count:
        raise UserError(
            f"--index {index} is out of range: {shown(path)} holds {count} records, so --index "
            f"takes 0..{count - 1} (or -{count}..-1, counted from the end)"
        )
    return keys[index]


def register(parser: argparse.ArgumentParser) -> None:
    add_database_arguments(parser)
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--index",
        type=int,
        help="position in key order: 0 is the first record, -1 the last (negatives count "
        "from the end)",
    )
    which.add_argument("--key", help="the record's key")
    parser.add_argument(
        "--out", required=True, type=path_value, help="image file to write, e.g. img.png"
    )
    parser.add_argument(
        "--num_channels",
        type=int,
        choices=(1, 3),
        default=3,
        help="as the trainer's --num_channels",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    which = args.index if args.key is None else args.key.encode("utf-8", "surrogateescape")
    key, label = dump_record(args.db_path, args.db_type, args.out, which, args.num_channels)
    print(f"key {printable_key(key)}  label {label}  -> {args.out}")
    return 0
