"""Where `resnet50-db create` finds its images, and how one image file becomes a Record."""

from __future__ import annotations

import errno
import io
import os
import random
import re
import stat
from dataclasses import dataclass, replace

import numpy as np
from PIL import Image

from resnet50_trainer.data.formats.db_types import LMDB
from resnet50_trainer.data.formats.images import (
    decode_native,
    encoded_format,
    library_noise_silenced,
    with_channels,
)
from resnet50_trainer.data.formats.jpeg_region import with_restart_markers
from resnet50_trainer.data.formats.records import DATUM, Record
from resnet50_trainer.errors import RecordError, UserError
from resnet50_trainer.path_words import shown

# Pillow's format names for --encode_type
_ENCODE_FORMATS = {"jpg": "JPEG", "png": "PNG"}
# A list-file label: what convert_imageset's int label can hold, in plain ASCII digits.
_LABEL = re.compile(r"[0-9]+")
_MAX_LABEL = 2**31 - 1
_EXIF_ORIENTATION = 0x0112
# EXIF orientation -> the transposition that makes the image upright (as OpenCV's imread does).
_UPRIGHT = {
    2: Image.Transpose.FLIP_LEFT_RIGHT,
    3: Image.Transpose.ROTATE_180,
    4: Image.Transpose.FLIP_TOP_BOTTOM,
    5: Image.Transpose.TRANSPOSE,
    6: Image.Transpose.ROTATE_270,
    7: Image.Transpose.TRANSVERSE,
    8: Image.Transpose.ROTATE_90,
}
_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


@dataclass(frozen=True)
class CreateOptions:
    db_path: str
    source: str | None = None  # a folder with one subfolder per class
    list_file: str | None = None  # or convert_imageset's list: "relative/path label" per line
    root: str = ""  # folder the list file's paths are relative to
    db_type: str = LMDB
    record_format: str = DATUM
    encoded: bool = True
    resize: tuple[int, int] | None = None  # (width, height), exact, as convert_imageset
    shorter_side: int | None = None  # keeps the aspect ratio
    encode_type: str | None = None  # "jpg" / "png"; None keeps the file's own format
    quality: int = 95  # JPEG quality when (re-)encoding; OpenCV's default
    gray: bool = False
    shuffle: bool = False
    seed: int = 0
    num_workers: int = 1
    overwrite: bool = False
    restart_markers: bool = False  # JPEGs rewritten losslessly with one after every MCU
    batch_size: int = 1000  # records per commit, as both original tools


class NotRegularFileError(OSError):
    """A path that is no regular file (nor a symlink to one): never opened for reading."""


def read_regular_file(path: str) -> bytes:
    """The bytes of the regular file at `path`, symlinks followed. Anything else raises
    NotRegularFileError before it is read: a FIFO would block forever, a device never end. The
    open does not block either, and the kind is checked again on the open file (it may have been
    swapped since)."""
    _check_regular(os.stat(path).st_mode, path)
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY), "rb") as file:
        _check_regular(os.fstat(file.fileno()).st_mode, path)
        return file.read()


def _check_regular(mode: int, path: str) -> None:
    if not stat.S_ISREG(mode):
        kind = next((name for is_kind, name in _FILE_KINDS if is_kind(mode)), "not a file")
        raise NotRegularFileError(errno.EINVAL, f"{kind}, not a regular file", path)


@dataclass(frozen=True)
class ImageTask:
    index: int  # the line's position (after shuffling): the key's number, gaps where skipped
    relative_path: str
    path: str
    label: int

    def key(self, count: int) -> bytes:
        """The record's key among `count` tasks: its place, then its path."""
        return place_key(self.index, self.relative_path.encode("utf-8", "surrogateescape"), count)


def place_key(place: int, name: bytes, count: int) -> bytes:
    """`name` prefixed with its place among `count` records, zero-padded to one width for all of
    them (convert_imageset's "%08d_", wider past 10^8) so that key order is place order."""
    return b"%0*d_" % (max(8, len(str(count - 1))), place) + name


def seeded_order(count: int, seed: int) -> list[int]:
    """0..count-1 in the random order `seed` gives: create --shuffle's and copy --shuffle's."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return order


def _numbered(entries: list[tuple[str, str, int]]) -> list[ImageTask]:
    return [
        ImageTask(index, relative, path, label)
        for index, (relative, path, label) in enumerate(entries)
    ]


def shuffled(tasks: list[ImageTask], seed: int) -> list[ImageTask]:
    """The tasks in a seeded random order, numbered anew: keys follow the order in the DB."""
    order = seeded_order(len(tasks), seed)
    return [replace(tasks[index], index=place) for place, index in enumerate(order)]


def read_list_file(list_file: str, root: str) -> list[ImageTask]:
    """convert_imageset's list: "relative/path label" per line, split at the last whitespace."""
    try:
        text = read_regular_file(list_file).decode("utf-8")
    except OSError as exc:
        raise UserError(
            f"cannot read list file {shown(list_file)} ({exc.strerror or exc}); check the path"
        ) from exc
    except UnicodeDecodeError as exc:
        raise UserError(
            f"list file {shown(list_file)} is not UTF-8 text (byte {exc.start}); give a "
            "text file of 'relative/path label' lines"
        ) from exc
    if "\0" in text:
        raise UserError(
            f"list file {shown(list_file)} holds NUL bytes, so it is not a text file; give "
            "a text file of 'relative/path label' lines"
        )
    entries = [
        _list_entry(list_file, number, line, root)
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip()
    ]
    if not entries:
        raise UserError(
            f"list file {shown(list_file)} names no images; add 'relative/path label' lines"
        )
    return _numbered(entries)


def _list_entry(list_file: str, number: int, line: str, root: str) -> tuple[str, str, int]:
    parts = line.rstrip().rsplit(maxsplit=1)
    if len(parts) != 2 or not _LABEL.fullmatch(parts[1]) or int(parts[1]) > _MAX_LABEL:
        excerpt = line if len(line) <= 80 else line[:77] + "..."
        raise UserError(
            f"{shown(list_file)} line {number} is {excerpt!r}; expected 'relative/path label' "
            f"with a label within 0..{_MAX_LABEL}"
        )
    return parts[0], os.path.join(root, parts[0]), int(parts[1])


def read_class_folders(source: str) -> tuple[list[ImageTask], list[str]]:
    """Every file under SOURCE/<class>/ (recursively, sorted); labels follow sorted class names."""
    if not os.path.isdir(source):
        raise UserError(
            f"image folder {shown(source)} does not exist; pass a folder with one "
            "subfolder per class, or use --list_file"
        )
    class_names = sorted(
        name
        for name in os.listdir(source)
        if not name.startswith(".") and os.path.isdir(os.path.join(source, name))
    )
    if not class_names:
        raise UserError(
            f"{shown(source)} has no class subfolders; put each class's images in its own "
            "subfolder, or use --list_file"
        )
    entries = []
    for label, class_name in enumerate(class_names):
        for relative in _files_under(source, class_name):
            entries.append((relative, os.path.join(source, relative), label))
    if not entries:
        raise UserError(f"the class subfolders of {shown(source)} hold no files")
    return _numbered(entries), class_names


def _files_under(source: str, class_name: str) -> list[str]:
    """Every entry below the class folder but folders, which are walked: what is not a regular
    file is skipped and named later, when it is read. Symlinked folders are listed, not walked
    (no loops)."""
    relatives = []
    for folder, subfolders, files in os.walk(os.path.join(source, class_name), onerror=_unlistable):
        subfolders.sort()
        linked = [name for name in subfolders if os.path.islink(os.path.join(folder, name))]
        for name in files + linked:
            relatives.append(os.path.relpath(os.path.join(folder, name), source))
    return sorted(relative.replace(os.sep, "/") for relative in relatives)


def _unlistable(error: OSError) -> None:
    raise UserError(
        f"cannot list the image folder {error.filename} ({error.strerror}); "
        "make it readable or move it out of the class folders"
    )


def _target_size(size: tuple[int, int], options: CreateOptions) -> tuple[int, int]:
    if options.resize is not None:
        return options.resize
    if options.shorter_side is None:
        return size
    width, height = size
    scale = options.shorter_side / min(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def build_record(data: bytes, label: int, options: CreateOptions) -> Record:
    """The record of one image file's bytes (_build_record), its JPEG given a restart marker after
    every MCU with --restart_markers: losslessly, so the pixels are the same. A JPEG libjpeg-turbo
    finds damaged (one Pillow still reads) is kept as it is, which the trainer decodes whole."""
    record = _build_record(data, label, options)
    if not options.restart_markers or record.encoded is None:
        return record
    return replace(record, encoded=restart_markers_if_jpeg(bytes(record.encoded)))


def restart_markers_if_jpeg(file: bytes) -> bytes:
    """A JPEG rewritten with a restart marker after every MCU (losslessly); anything else, and a
    JPEG libjpeg-turbo finds damaged, as it is."""
    try:
        return with_restart_markers(file) if encoded_format(file) == "JPEG" else file
    except RecordError:
        return file


def _build_record(data: bytes, label: int, options: CreateOptions) -> Record:
    """The record `create` stores for one image file's bytes; RecordError if it is no image.

    Pixels are what OpenCV's imread (convert_imageset's reader) gives: 8 bits (images.decode_native
    converts other depths and modes as it does) and upright (an EXIF orientation is applied).
    Encoded records keep the file's bytes when nothing about the image changes (as convert_imageset
    does); otherwise the image is converted, turned upright, resized (bilinear, like OpenCV's
    INTER_LINEAR) and encoded again. Raw records hold the pixels; records.serialize_record stores
    them in BGR order.
    """
    source = Record(label=label, encoded=data, pixels=None, format=options.record_format)
    image = decode_native(source)  # the trainer's decoder: what it can read, we accept
    file_format, upright = _format_and_orientation(data)
    if upright is not None:
        image = image.transpose(upright)
    mode = "L" if options.gray else "RGB"
    size = _target_size(image.size, options)
    encode_format = (options.encode_type and _ENCODE_FORMATS.get(options.encode_type)) or (
        file_format if file_format in ("JPEG", "PNG") else "PNG"
    )
    unchanged = image.mode == mode and image.size == size and upright is None
    if options.encoded and unchanged and encode_format == file_format:
        return source
    image = with_channels(image, 1 if options.gray else 3)
    if image.size != size:
        image = image.resize(size, Image.Resampling.BILINEAR)
    if not options.encoded:
        pixels = np.asarray(image)
        pixels = pixels[:, :, None] if pixels.ndim == 2 else pixels
        return Record(label=label, encoded=None, pixels=pixels, format=options.record_format)
    buffer = io.BytesIO()  # saved without EXIF: the pixels are upright now
    if encode_format == "JPEG":
        image.save(buffer, "JPEG", quality=options.quality)
    else:
        image.save(buffer, "PNG")
    return Record(label=label, encoded=buffer.getvalue(), pixels=None, format=options.record_format)


def _format_and_orientation(data: bytes) -> tuple[str, Image.Transpose | None]:
    """The file's format, and the transposition its EXIF orientation asks for (None: upright)."""
    file_format = encoded_format(data)
    try:
        with library_noise_silenced(data), Image.open(io.BytesIO(data)) as image:
            orientation = image.getexif().get(_EXIF_ORIENTATION)
    except Exception:  # noqa: BLE001 - Pillow's EXIF parser raises many kinds on damaged blocks
        return file_format, None  # as OpenCV, which ignores an EXIF block it cannot parse
    return file_format, _UPRIGHT.get(orientation) if isinstance(orientation, int) else None
