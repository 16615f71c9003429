"""`resnet50-db inspect`: what is inside a database, read with the trainer's own record decoder.

Records that cannot be parsed count as failed and nowhere else; parsed records count in formats,
storage and labels; of those, the ones whose image cannot be decoded count as failed too, and the
rest give the image sizes and channels.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from dataclasses import dataclass, field

from PIL import Image, ImageDraw, ImageOps

from resnet50_trainer.config.values import path_value
from resnet50_trainer.data.formats.databases import open_database
from resnet50_trainer.data.formats.images import decode_image, decode_native, encoded_format
from resnet50_trainer.data.formats.keys import printable_key
from resnet50_trainer.data.formats.records import Record, parse_record
from resnet50_trainer.errors import RecordError, UserError
from resnet50_trainer.path_words import shown
from resnet50_trainer.tools.db.arguments import add_database_arguments
from resnet50_trainer.tools.output_file import replacing

HELP = "report what a database holds"
DESCRIPTION = (
    "Count records, formats, labels, sizes and unreadable records, as the trainer reads them."
)


FAILED_KEYS_SHOWN = 5
_SHEET_CELL = 96  # pixels per contact-sheet thumbnail
_SHEET_COLUMNS = 8


@dataclass
class Inspection:
    path: str
    db_type: str
    records: int = 0
    inspected: int = 0
    formats: Counter = field(default_factory=Counter)
    storage: Counter = field(default_factory=Counter)  # "encoded" / "raw"
    encodings: Counter = field(default_factory=Counter)  # file formats of encoded images
    labels: Counter = field(default_factory=Counter)
    channels: Counter = field(default_factory=Counter)
    widths: list[int] = field(default_factory=lambda: [])
    heights: list[int] = field(default_factory=lambda: [])
    failed: int = 0
    failed_first: list[tuple[str, str]] = field(default_factory=list)  # (key, error)

    def count_failure(self, key: bytes, error: RecordError) -> None:
        self.failed += 1
        if len(self.failed_first) < FAILED_KEYS_SHOWN:
            self.failed_first.append((printable_key(key), str(error)))

    def count_record(self, record: Record) -> None:
        self.formats[record.format] += 1
        self.labels[record.label] += 1
        self.storage["encoded" if record.is_encoded else "raw"] += 1

    def count_image(self, record: Record, image: Image.Image) -> None:
        if record.encoded is not None:
            self.encodings[encoded_format(record.encoded)] += 1
        self.channels[len(image.getbands())] += 1
        self.widths.append(image.width)
        self.heights.append(image.height)

    def warnings(self) -> list[str]:
        found = []
        if self.failed:
            found.append(
                f"{self.failed} records cannot be read; the trainer skips them, and stops "
                "above --max_bad_records (default 1% of an epoch)"
            )
        if len(self.labels) == 1:
            found.append(
                f"every record has label {next(iter(self.labels))}: a classifier "
                "learns nothing (accuracy is trivially 1); check the labels"
            )
        if self.labels and (min(self.labels) < 0 or len(self.labels) != max(self.labels) + 1):
            found.append("labels are not exactly 0..N-1; --num_labels must exceed the largest")
        if len(self.formats) > 1:
            found.append("records of more than one format are mixed in this database")
        return found

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "db_type": self.db_type,
            "records": self.records,
            "inspected": self.inspected,
            "formats": dict(self.formats),
            "storage": dict(self.storage),
            "encodings": dict(self.encodings),
            "channels": dict(self.channels),
            "labels": {
                "min": min(self.labels, default=None),
                "max": max(self.labels, default=None),
                "counts": dict(sorted(self.labels.items())),
            },
            "width": {"min": min(self.widths, default=None), "max": max(self.widths, default=None)},
            "height": {
                "min": min(self.heights, default=None),
                "max": max(self.heights, default=None),
            },
            "failed": {
                "count": self.failed,
                "first": [{"key": key, "error": error} for key, error in self.failed_first],
            },
            "warnings": self.warnings(),
        }


def inspect_database(path: str, db_type: str, limit: int | None = None) -> Inspection:
    """Read the first `limit` records (all when None) and tally what they hold."""
    with open_database(path, db_type, allow_empty=True) as database:
        keys = database.keys()
        report = Inspection(path=path, db_type=db_type, records=len(keys))
        for key in keys[:limit]:
            report.inspected += 1
            try:
                record = parse_record(database.get(key))
            except RecordError as error:
                report.count_failure(key, error)
                continue
            report.count_record(record)
            try:
                report.count_image(record, decode_native(record))
            except RecordError as error:
                report.count_failure(key, error)
    return report


def _counts(counter: Counter) -> str:
    return ", ".join(f"{name}: {count}" for name, count in sorted(counter.items())) or "-"


def format_report(report: Inspection) -> str:
    scope = (
        "all inspected"
        if report.inspected == report.records
        else f"first {report.inspected} inspected"
    )
    lines = [
        f"database    {report.path} ({report.db_type})",
        f"records     {report.records} ({scope})",
        f"formats     {_counts(report.formats)}",
        f"storage     {_counts(report.storage)}",
        f"encodings   {_counts(report.encodings)}",
    ]
    if report.labels:
        lines.append(
            f"labels      {min(report.labels)}..{max(report.labels)}, {len(report.labels)} distinct"
        )
        lines.append(f"per label   {_counts(report.labels)}")
    if report.widths:
        lines.append(
            f"image size  width {min(report.widths)}..{max(report.widths)}, "
            f"height {min(report.heights)}..{max(report.heights)}"
        )
    lines.append(f"channels    {_counts(report.channels)}")
    lines.append(f"failed      {report.failed}")
    lines += [f"  {key}: {error}" for key, error in report.failed_first]
    lines += [f"WARNING     {warning}" for warning in report.warnings()]
    return "\n".join(lines)


def write_contact_sheet(path: str, db_type: str, out: str, count: int) -> int:
    """A grid of the first `count` images as the trainer decodes them, each with its label."""
    with open_database(path, db_type, allow_empty=True) as database:
        keys = database.keys()[:count]
        columns = min(_SHEET_COLUMNS, max(1, len(keys)))
        rows = max(1, -(-len(keys) // columns))
        sheet = Image.new("RGB", (columns * _SHEET_CELL, rows * (_SHEET_CELL + 14)), "white")
        draw = ImageDraw.Draw(sheet)
        for position, key in enumerate(keys):
            left = (position % columns) * _SHEET_CELL
            top = (position // columns) * (_SHEET_CELL + 14)
            try:
                record = parse_record(database.get(key))
                image = ImageOps.contain(
                    decode_image(record, num_channels=3), (_SHEET_CELL - 4, _SHEET_CELL - 4)
                )
                sheet.paste(image, (left + 2, top + 2))
                caption = f"label {record.label}"
            except RecordError:
                caption = "unreadable"
            draw.text((left + 2, top + _SHEET_CELL), caption, fill="black")
    with replacing(out, "--sheet", "room for the sheet") as partial:
        sheet.save(partial, format=Image.registered_extensions()[os.path.splitext(out)[1].lower()])
    return len(keys)


def register(parser: argparse.ArgumentParser) -> None:
    add_database_arguments(parser)
    parser.add_argument("--limit", type=int, help="inspect only the first N records")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--sheet", metavar="OUT.png", type=path_value, help="write a contact sheet of images"
    )
    parser.add_argument("--sheet_count", type=int, default=32, help="images on the sheet")
    parser.set_defaults(run=lambda args: run(parser, args))


def _check_sheet_path(out: str) -> None:
    parent = os.path.dirname(os.path.abspath(out))
    if os.path.splitext(out)[1].lower() not in Image.registered_extensions() or not os.path.isdir(
        parent
    ):
        raise UserError(
            f"--sheet {shown(out)}: give an image path (e.g. sheet.png) in an existing directory"
        )


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    if args.sheet_count < 1:
        parser.error("--sheet_count must be at least 1")
    if args.sheet:
        _check_sheet_path(args.sheet)  # before the pass over the DB, not after it
    report = inspect_database(args.db_path, args.db_type, args.limit)
    print(json.dumps(report.to_json(), indent=2) if args.json else format_report(report))
    if args.sheet:
        shown = write_contact_sheet(args.db_path, args.db_type, args.sheet, args.sheet_count)
        if not args.json:
            print(f"contact sheet of {shown} images: {args.sheet}")
    return 0
