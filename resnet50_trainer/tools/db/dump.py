"""`resnet50-db dump`: one record's image, exactly as the trainer's decoder sees it."""

from __future__ import annotations

import argparse

from resnet50_trainer.data.formats.databases import open_database
from resnet50_trainer.data.formats.records import decode_image, parse_record
from resnet50_trainer.errors import UserError
from resnet50_trainer.tools.db.arguments import add_subcommand


def dump_record(
    path: str,
    db_type: str,
    out: str,
    index: int | None = None,
    key: bytes | None = None,
    num_channels: int = 3,
) -> tuple[bytes, int]:
    """Write the record at key-order position `index` (or under `key`) to `out`; (key, label)."""
    with open_database(path, db_type) as database:
        if key is None:
            assert index is not None, "dump_record takes an index or a key"
            keys = database.keys()
            if not -len(keys) <= index < len(keys):
                raise UserError(
                    f"--index {index} is out of range: {path} holds {len(keys)} "
                    f"records (0..{len(keys) - 1})"
                )
            key = keys[index]
        record = parse_record(database.get(key))
    image = decode_image(record, num_channels)
    try:
        image.save(out)
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot write {out} ({exc}); use a writable path ending in .png") from exc
    return key, record.label


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = add_subcommand(
        subparsers,
        "dump",
        help="write one record's decoded image",
        description="Write a record's image as the trainer decodes "
        "it (before augmentation) and print its label.",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--index", type=int, help="position in key order, from 0")
    which.add_argument("--key", help="the record's key")
    parser.add_argument("--out", required=True, help="image file to write, e.g. img.png")
    parser.add_argument(
        "--num_channels",
        type=int,
        choices=(1, 3),
        default=3,
        help="as the trainer's --num_channels",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    key = None if args.key is None else args.key.encode("utf-8", "surrogateescape")
    key, label = dump_record(
        args.db_path, args.db_type, args.out, args.index, key, args.num_channels
    )
    print(f"key {key.decode('utf-8', 'backslashreplace')}  label {label}  -> {args.out}")
    return 0
