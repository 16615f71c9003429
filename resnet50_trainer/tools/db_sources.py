"""Where `resnet50-db create` finds its images, and how one image file becomes a Record."""

from __future__ import annotations

import io
import os
import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from resnet50_trainer.data.records import Record, decode_native, encoded_format
from resnet50_trainer.errors import UserError

if TYPE_CHECKING:
    from resnet50_trainer.tools.db_create import CreateOptions

# Pillow's format names for --encode_type
_ENCODE_FORMATS = {"jpg": "JPEG", "png": "PNG"}


@dataclass(frozen=True)
class ImageTask:
    index: int  # the line's position (after shuffling): the key's number, gaps where skipped
    relative_path: str
    path: str
    label: int

    @property
    def key(self) -> str:
        return f"{self.index:08d}_{self.relative_path}"


def _numbered(entries: list[tuple[str, str, int]]) -> list[ImageTask]:
    return [ImageTask(index, relative, path, label)
            for index, (relative, path, label) in enumerate(entries)]


def shuffled(tasks: list[ImageTask], seed: int) -> list[ImageTask]:
    """The tasks in a seeded random order, numbered anew: keys follow the order in the DB."""
    order = list(tasks)
    random.Random(seed).shuffle(order)
    return [replace(task, index=index) for index, task in enumerate(order)]


def read_list_file(list_file: str, root: str) -> list[ImageTask]:
    """convert_imageset's list: "relative/path label" per line, split at the last whitespace."""
    try:
        with open(list_file, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except OSError as exc:
        raise UserError(f"cannot read list file {list_file} ({exc.strerror}); check the path") \
            from exc
    entries = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        parts = line.rstrip().rsplit(maxsplit=1)
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            raise UserError(f"{list_file} line {number} is {line!r}; expected "
                            "'relative/path label' with an integer label")
        entries.append((parts[0], os.path.join(root, parts[0]), int(parts[1])))
    if not entries:
        raise UserError(f"list file {list_file} names no images; add 'relative/path label' lines")
    return _numbered(entries)


def read_class_folders(source: str) -> tuple[list[ImageTask], list[str]]:
    """Every file under SOURCE/<class>/ (recursively, sorted); labels follow sorted class names."""
    if not os.path.isdir(source):
        raise UserError(f"image folder {source} does not exist; pass a folder with one "
                        "subfolder per class, or use --list_file")
    class_names = sorted(name for name in os.listdir(source)
                         if not name.startswith(".") and os.path.isdir(os.path.join(source, name)))
    if not class_names:
        raise UserError(f"{source} has no class subfolders; put each class's images in its own "
                        "subfolder, or use --list_file")
    entries = []
    for label, class_name in enumerate(class_names):
        for relative in _files_under(source, class_name):
            entries.append((relative, os.path.join(source, relative), label))
    if not entries:
        raise UserError(f"the class subfolders of {source} hold no files")
    return _numbered(entries), class_names


def _files_under(source: str, class_name: str) -> list[str]:
    relatives = []
    for folder, subfolders, files in os.walk(os.path.join(source, class_name)):
        subfolders.sort()
        for name in files:
            relatives.append(os.path.relpath(os.path.join(folder, name), source))
    return sorted(relative.replace(os.sep, "/") for relative in relatives)


def _target_size(size: tuple[int, int], options: CreateOptions) -> tuple[int, int]:
    if options.resize is not None:
        return options.resize
    if options.shorter_side is None:
        return size
    width, height = size
    scale = options.shorter_side / min(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def build_record(data: bytes, label: int, options: CreateOptions) -> Record:
    """The record `create` stores for one image file's bytes; RecordError if it is no image.

    Encoded records keep the file's bytes when nothing about the image changes (as convert_imageset
    does); otherwise the image is converted, resized (bilinear, like OpenCV's INTER_LINEAR) and
    encoded again. Raw records hold the pixels; records.serialize_record stores them in BGR order.
    """
    source = Record(label=label, encoded=data, pixels=None, format=options.record_format)
    image = decode_native(source)  # the trainer's decoder: what it can read, we accept
    file_format = encoded_format(data)
    mode = "L" if options.gray else "RGB"
    size = _target_size(image.size, options)
    encode_format = _ENCODE_FORMATS.get(options.encode_type) or \
        (file_format if file_format in ("JPEG", "PNG") else "PNG")
    unchanged = image.mode == mode and image.size == size
    if options.encoded and unchanged and encode_format == file_format:
        return source
    if image.mode != mode:
        image = image.convert(mode)
    if image.size != size:
        image = image.resize(size, Image.Resampling.BILINEAR)
    if not options.encoded:
        pixels = np.asarray(image)
        pixels = pixels[:, :, None] if pixels.ndim == 2 else pixels
        return Record(label=label, encoded=None, pixels=pixels, format=options.record_format)
    buffer = io.BytesIO()
    if encode_format == "JPEG":
        image.save(buffer, "JPEG", quality=options.quality)
    else:
        image.save(buffer, "PNG")
    return Record(label=label, encoded=buffer.getvalue(), pixels=None,
                  format=options.record_format)
