"""`resnet50-db create / inspect / dump`, run in-process through main()."""

from __future__ import annotations

import io
import json
import logging
import os
import struct
import subprocess
import zlib

import numpy as np
import pytest
from PIL import Image, ImageOps

from resnet50_trainer.data.formats import protos
from resnet50_trainer.data.formats.databases import open_database
from resnet50_trainer.data.formats.records import parse_record
from resnet50_trainer.errors import UserError
from resnet50_trainer.tools.db.build import _write_labels
from resnet50_trainer.tools.db.command import main
from resnet50_trainer.tools.db.in_place import _install_labels, built_in_place
from resnet50_trainer.tools.db.sources import CreateOptions, place_key
from tests.support.dbfactory import (
    caffe_key,
    cut_short,
    datum_record,
    encode_image,
    encoded_of,
    make_jpeg,
    pixels_of,
    random_pixels,
    smooth_pixels,
    tensorprotos_record,
    write_class_folders,
    write_db,
)
from tests.support.trainer_runs import REPOSITORY

SAMPLE_DATA = os.path.join(REPOSITORY, "sample_data")


def _dump(db, db_type, index, out, num_channels=3):
    assert (
        main(
            [
                "dump",
                db,
                "--db_type",
                db_type,
                "--index",
                str(index),
                "--out",
                out,
                "--num_channels",
                str(num_channels),
            ]
        )
        == 0
    )
    return np.asarray(Image.open(out))


def _stored_values(db, db_type):
    with open_database(db, db_type) as database:
        return [(key, database.get(key)) for key in database.keys()]


@pytest.mark.parametrize("db_type", ["lmdb", "leveldb"])
@pytest.mark.parametrize("record_format", ["datum", "tensorprotos"])
@pytest.mark.parametrize("storage", ["raw", "png", "jpg"])
def test_create_then_dump_gives_back_the_pixels(tmp_path, db_type, record_format, storage):
    image_format = "JPEG" if storage == "jpg" else "PNG"
    sources = write_class_folders(str(tmp_path / "images"), 2, 2, image_format=image_format)
    db = str(tmp_path / "db")
    flags = ["--raw"] if storage == "raw" else []
    assert (
        main(
            [
                "create",
                str(tmp_path / "images"),
                db,
                "--db_type",
                db_type,
                "--format",
                record_format,
                *flags,
            ]
        )
        == 0
    )
    stored = _stored_values(db, db_type)
    assert [key for key, _ in stored] == [
        caffe_key(i, f"class_{i // 2}/img_{i % 2}.{storage if storage != 'raw' else 'png'}")
        for i in range(4)
    ]
    for index, (pixels, (_, value)) in enumerate(zip(sources, stored)):
        dumped = _dump(db, db_type, index, str(tmp_path / f"{index}.png"))
        record = parse_record(value)
        assert (record.label, record.format) == (index // 2, record_format)
        if storage == "jpg":  # the file's bytes are kept; the decode is Pillow's
            expected = np.asarray(Image.open(io.BytesIO(encoded_of(record))).convert("RGB"))
        else:
            expected = pixels
        np.testing.assert_array_equal(dumped, expected)


def test_raw_records_are_laid_out_as_the_original_tools_write_them(tmp_path):
    sources = write_class_folders(str(tmp_path / "images"), 1, 1, image_format="PNG")
    for record_format, builder in [("datum", datum_record), ("tensorprotos", tensorprotos_record)]:
        db = str(tmp_path / record_format)
        assert (
            main(["create", str(tmp_path / "images"), db, "--raw", "--format", record_format]) == 0
        )
        assert _stored_values(db, "lmdb") == [
            (caffe_key(0, "class_0/img_0.png"), builder(0, sources[0]))
        ]


def test_encoded_datum_keeps_the_file_bytes_as_convert_imageset_does(tmp_path):
    write_class_folders(str(tmp_path / "images"), 1, 1)
    db = str(tmp_path / "db")
    assert main(["create", str(tmp_path / "images"), db]) == 0
    with open(tmp_path / "images" / "class_0" / "img_0.jpg", "rb") as file:
        expected = datum_record(0, encoded=file.read())
    assert _stored_values(db, "lmdb") == [(caffe_key(0, "class_0/img_0.jpg"), expected)]
    assert (tmp_path / "db.labels.txt").read_text() == "0 class_0\n"


def test_restart_markers_rewrite_jpegs_losslessly_and_only_jpegs(tmp_path, capsys):
    """--restart_markers: every JPEG, kept or re-encoded, gets a restart marker after every MCU
    (DRI of 1) and decodes to the source's pixels; a PNG is stored as it is. With --raw or PNG
    output it is refused in one line."""
    images = tmp_path / "images"
    write_class_folders(str(images), 1, 2, size=40)
    Image.fromarray(smooth_pixels(24, 30, 3, 5)).save(images / "class_0" / "img_2.png")
    for flags in ([], ["--shorter_side", "24"]):
        db = str(tmp_path / f"db{len(flags)}")
        assert main(["create", str(images), db, "--restart_markers", *flags]) == 0
        names = ["img_0.jpg", "img_1.jpg", "img_2.png"]
        for name, (_, value) in zip(names, _stored_values(db, "lmdb")):
            stored = encoded_of(parse_record(value))
            source = (images / "class_0" / name).read_bytes()
            if name.endswith(".png"):
                assert stored == source
                continue
            assert b"\xff\xdd\x00\x04\x00\x01" in stored  # DRI: an interval of 1 MCU
            expected = np.asarray(Image.open(io.BytesIO(source)).convert("RGB"))
            if flags:  # re-encoded at the new size, then rewritten: Pillow's own re-encode
                expected = np.asarray(Image.open(io.BytesIO(stored)))
                assert min(expected.shape[:2]) == 24
            np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(stored))), expected)
    capsys.readouterr()
    for refused, said in [
        (["--raw"], "--raw stores none"),
        (["--encode_type", "png"], "--encode_type png makes none"),
    ]:
        with pytest.raises(SystemExit) as caught:
            main(["create", str(images), str(tmp_path / "no"), "--restart_markers", *refused])
        assert caught.value.code == 2 and said in capsys.readouterr().err
    assert not (tmp_path / "no").exists()


def test_copy_rewrites_only_the_jpegs_and_keeps_every_other_byte(tmp_path, capsys):
    """copy --restart_markers (to LevelDB here): the same keys in the same order; a Datum's and
    a TensorProtos' JPEG get restart markers and decode to the same pixels; a PNG, raw pixels
    and a value that is no record are copied byte for byte."""
    jpeg, png = make_jpeg(40, 56, seed=1), encode_image(smooth_pixels(20, 24, 3, 2), "PNG")
    records = [
        (caffe_key(0, "a.jpg"), datum_record(3, encoded=jpeg)),
        (caffe_key(1, "b.jpg"), tensorprotos_record(4, encoded=jpeg)),
        (caffe_key(2, "c.png"), datum_record(5, encoded=png)),
        (caffe_key(3, "d.raw"), datum_record(6, random_pixels(4, 5))),
        (caffe_key(4, "e.junk"), b"\x08\x01junk"),
    ]
    source = write_db(str(tmp_path / "source"), "lmdb", records)
    copied = str(tmp_path / "copied")
    assert main(["copy", source, copied, "--restart_markers", "--db_type", "leveldb"]) == 0
    assert "copied 5 records" in capsys.readouterr().out
    stored = _stored_values(copied, "leveldb")
    assert [key for key, _ in stored] == [key for key, _ in records]
    for (_, original), (_, value) in zip(records[:2], stored[:2]):
        before, after = parse_record(original), parse_record(value)
        assert (after.label, after.format) == (before.label, before.format)
        assert b"\xff\xdd\x00\x04\x00\x01" in encoded_of(after)
        np.testing.assert_array_equal(
            np.asarray(Image.open(io.BytesIO(encoded_of(after)))),
            np.asarray(Image.open(io.BytesIO(jpeg))),
        )
    assert stored[2:] == records[2:]
    plain = str(tmp_path / "plain")
    assert main(["copy", copied, plain]) == 0  # the source's type, and no rewriting
    assert _stored_values(plain, "leveldb") == stored


@pytest.mark.parametrize("db_type", ["lmdb", "leveldb"])
def test_copy_shuffle_writes_every_record_once_in_a_seeded_order_out_of_label_order(
    tmp_path, capsys, db_type
):
    records = [
        (b"%04d" % index, datum_record(index // 20, random_pixels(2, 2))) for index in range(200)
    ]
    source = write_db(str(tmp_path / "sorted"), "lmdb", records)
    copies = []
    for name, seed in (("a", "3"), ("b", "3"), ("c", "4")):
        target = str(tmp_path / name)
        assert (
            main(["copy", source, target, "--shuffle", "--seed", seed, "--db_type", db_type]) == 0
        )
        assert "shuffled (seed " in capsys.readouterr().out
        with open_database(target, db_type) as copy:
            copies.append([(bytes(key), bytes(value)) for key, value in copy.items()])
    first, again, other = copies
    assert first == again and first != other  # the seed's order, and only its
    # Each key its place in the copy, then the source's key; each value the source's under it.
    assert [key[:9] for key, _ in first] == [b"%08d_" % place for place in range(200)]
    assert sorted((key[9:], value) for key, value in first) == records
    # Out of label order: neighbours of a shuffled copy of 10 labels mostly differ.
    labels = [parse_record(value).label for _, value in first]
    assert sum(one != other for one, other in zip(labels, labels[1:])) > 150


@pytest.mark.parametrize("count", [2, 10**8, 10**8 + 1, 10**12])
def test_place_keys_sort_in_place_order_at_any_count(count):
    """create's and copy's keys: "%08d_" below 10^8 records (convert_imageset's), one wider
    width for all of them past it, so that key order stays place order."""
    places = sorted({0, 1, 9, count // 2, count - 2, count - 1})
    keys = [place_key(place, b"x.jpg", count) for place in places]
    assert sorted(keys) == keys and len({len(key) for key in keys}) == 1
    assert keys[0] == (
        b"00000000_x.jpg" if count <= 10**8 else b"0" * len(str(count - 1)) + b"_x.jpg"
    )


@pytest.mark.parametrize("command", ["copy", "create"])
@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--seed", "5"], "--seed seeds --shuffle's order"),
        (["--shuffle", "--seed", "-1"], "invalid value '-1': use an integer from 0"),
        (["--shuffle", "--seed", "-inf"], "invalid value '-inf': use an integer from 0"),
    ],
)
def test_a_seed_without_shuffle_or_out_of_range_is_one_line(tmp_path, capsys, command, flags, said):
    source = write_db(str(tmp_path / "s"), "lmdb", [(b"k", datum_record(0, random_pixels(2, 2)))])
    if command == "create":
        source = str(tmp_path)
    with pytest.raises(SystemExit) as caught:
        main([command, source, str(tmp_path / "out"), *flags])
    assert caught.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert said in line, line
    assert not (tmp_path / "out").exists()


def test_copy_refuses_what_it_cannot_copy_to_or_from(tmp_path, capsys):
    source = write_db(
        str(tmp_path / "source"), "lmdb", [(b"k", datum_record(0, random_pixels(2, 2)))]
    )
    (tmp_path / "folder").mkdir()
    for source_path, target, expected in [
        (source, source, "is the database to copy"),
        (source, os.path.join(source, "copy"), "copy is inside"),
        (str(tmp_path / "folder"), str(tmp_path / "x"), "is no LMDB or LevelDB directory"),
        (source, str(tmp_path / "folder"), "already exists; pass --overwrite"),
    ]:
        assert main(["copy", source_path, target]) == 2
        assert expected in capsys.readouterr().err
    for command in (["copy", source], ["create", str(tmp_path / "folder")]):
        for workers in ("0", "129", "99999999999999999999"):  # not a fork bomb
            with pytest.raises(SystemExit) as caught:
                main([*command, str(tmp_path / "x"), "--num_workers", workers])
            assert caught.value.code == 2
            assert "use an integer from 1 to 128" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["folder", "source"]
    assert sorted(os.listdir(source)) == ["data.mdb", "lock.mdb"]


def test_a_copy_into_its_source_through_a_bind_mount_is_refused(tmp_path, capsys):
    source = write_db(str(tmp_path / "source"), "lmdb", [(b"k", b"v")])
    alias = tmp_path / "alias"
    alias.mkdir()
    refused = subprocess.run(["mount", "--bind", source, str(alias)], capture_output=True)
    if refused.returncode:
        pytest.skip(f"cannot bind-mount here: {refused.stderr.decode().strip()}")
    try:
        assert main(["copy", source, str(alias / "copy")]) == 2
        assert "copy is inside" in capsys.readouterr().err
        assert main(["copy", source, str(alias), "--overwrite"]) == 2
        assert "is the database to copy" in capsys.readouterr().err
    finally:
        subprocess.run(["umount", str(alias)], check=True)
    assert sorted(os.listdir(source)) == ["data.mdb", "lock.mdb"]


def test_a_labels_file_that_cannot_be_written_names_the_cause(tmp_path):
    with pytest.raises(UserError, match="check that the folder is still there and writable"):
        _write_labels(str(tmp_path / "moved away"), ["cat"])
    written = _write_labels(str(tmp_path), ["cat"])
    with pytest.raises(UserError, match="check that the folder is still there and writable"):
        _install_labels(written, str(tmp_path / "moved away" / "db"))


@pytest.mark.parametrize(
    "command",
    [["inspect"], ["dump", "--index", "0"], ["copy"], ["bench", "--batches", "1"]],
    ids=lambda command: command[0],
)
def test_an_lmdb_cut_short_is_refused_in_one_line_and_nothing_is_written(
    tmp_path, image_db, capsys, command
):
    """A page past data.mdb's end would kill the command (SIGBUS, exit 135, nothing said)."""
    db = cut_short(image_db("db", 40, 4))
    out = str(tmp_path / "out")
    arguments = {"dump": ["--out", out], "copy": [out]}.get(command[0], [])
    before = sorted(os.listdir(tmp_path))
    assert main([command[0], db, *command[1:], *arguments]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"resnet50-db {command[0]}: error: LMDB {db} is incomplete"), line
    assert sorted(os.listdir(tmp_path)) == before  # no copy, no .out.partial-* folder


def test_keys_lmdb_cannot_store_are_named_before_anything_is_written(tmp_path, capsys):
    """LevelDB takes any key; LMDB 1 to 511 bytes (max_key_size): a copy to LMDB or a create
    whose image paths make longer keys is refused at the first such key, naming the limit (LMDB
    reports it as a write error, which read as a full disk)."""
    long_key = b"k" * 600
    for unfit, size in [(long_key, 600), (b"", 0)]:
        source = write_db(
            str(tmp_path / f"source{size}"), "leveldb", [(b"a", b"v"), (unfit, b"v"), (b"z", b"v")]
        )
        assert main(["copy", source, str(tmp_path / "copy"), "--db_type", "lmdb"]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert f"is {size} bytes, but LMDB keys are 1 to 511 bytes; copy it to a LevelDB" in line
        assert not os.path.exists(tmp_path / "copy")
    assert main(["copy", source, str(tmp_path / "copy")]) == 0  # a LevelDB takes it
    image = os.path.join("d" * 200, "e" * 200, "f" * 120 + ".jpg")  # a key of 9 + 526 bytes
    os.makedirs(os.path.dirname(tmp_path / "images" / image))
    (tmp_path / "images" / image).write_bytes(make_jpeg())
    (tmp_path / "list.txt").write_text(f"{image} 0\n")
    list_file = ["--list_file", str(tmp_path / "list.txt"), "--root", str(tmp_path / "images")]
    assert main(["create", *list_file, str(tmp_path / "created")]) == 2
    assert "is 535 bytes, but LMDB keys are 1 to 511 bytes; shorten" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["copy", "images", "list.txt", "source0", "source600"]


def test_overwrite_replaces_only_a_directory_holding_nothing_but_a_database(tmp_path, capsys):
    """A folder with a database's file name in it and anything else (a project, the source of
    the copy itself) is refused with --overwrite, and left as it was; a database alone is
    replaced."""
    write_class_folders(str(tmp_path / "images"), 1, 1)
    source = write_db(
        str(tmp_path / "source"), "lmdb", [(b"k", datum_record(0, random_pixels(2, 2)))]
    )
    for db_file in ("data.mdb", "CURRENT"):
        project = tmp_path / f"project_{db_file}"
        (project / "sub").mkdir(parents=True)
        (project / db_file).write_bytes(b"")
        (project / "thesis.txt").write_text("important")
        for command in (["copy", source], ["create", str(tmp_path / "images")]):
            assert main([*command, str(project), "--overwrite"]) == 2
            assert "holding nothing else; refusing to overwrite it" in capsys.readouterr().err
        assert sorted(os.listdir(project)) == sorted([db_file, "sub", "thesis.txt"])
    # A DB inside another's folder (copy refuses to write one there; other tools may).
    nested = write_db(str(tmp_path / "source" / "inner"), "lmdb", [(b"k", b"v")])
    assert main(["copy", source, os.path.join(source, "copy")]) == 2  # into the source: refused
    assert main(["copy", nested, source, "--overwrite"]) == 2  # would remove its own source
    assert os.path.isdir(nested)
    copied = str(tmp_path / "copied")
    assert main(["copy", source, copied]) == 0
    assert main(["copy", nested, copied, "--overwrite"]) == 0  # a database alone: replaced


def test_a_target_that_appears_while_the_database_is_built_is_kept(tmp_path):
    """Checked again just before the finished database is put in place: whatever another
    process put at the target meanwhile stays, and the build is refused (no --overwrite)."""
    target = tmp_path / "db"

    def write(build_path: str, work_dir: str, summary, check_stop) -> None:
        write_db(build_path, "lmdb", [(b"k", datum_record(0, random_pixels(2, 2)))])
        target.mkdir()  # another run, or a user, puts something there meanwhile
        (target / "notes.txt").write_text("precious")

    with pytest.raises(UserError, match="already exists; pass --overwrite"):
        built_in_place(CreateOptions(db_path=str(target)), write)
    assert os.listdir(target) == ["notes.txt"]
    assert sorted(os.listdir(tmp_path)) == ["db"]  # the finished one removed, nothing else


def test_copy_brings_the_labels_file_along(tmp_path, capsys):
    write_class_folders(str(tmp_path / "images"), 2, 1)
    assert main(["create", str(tmp_path / "images"), str(tmp_path / "db")]) == 0
    assert main(["copy", str(tmp_path / "db"), str(tmp_path / "copy"), "--restart_markers"]) == 0
    assert f"labels: {tmp_path / 'copy.labels.txt'}" in capsys.readouterr().out
    assert (tmp_path / "copy.labels.txt").read_text() == "0 class_0\n1 class_1\n"


def test_resize_gray_and_reencoding(tmp_path):
    write_class_folders(str(tmp_path / "images"), 1, 2, size=32)
    db = str(tmp_path / "db")
    assert (
        main(
            [
                "create",
                str(tmp_path / "images"),
                db,
                "--gray",
                "--encode_type",
                "png",
                "--resize_height",
                "16",
                "--resize_width",
                "20",
                "--db_type",
                "leveldb",
            ]
        )
        == 0
    )
    record = parse_record(_stored_values(db, "leveldb")[0][1])
    assert Image.open(io.BytesIO(encoded_of(record))).format == "PNG"
    assert _dump(db, "leveldb", 0, str(tmp_path / "g.png"), num_channels=1).shape == (16, 20)
    shorter = str(tmp_path / "shorter")
    assert main(["create", str(tmp_path / "images"), shorter, "--raw", "--shorter_side", "16"]) == 0
    assert pixels_of(parse_record(_stored_values(shorter, "lmdb")[0][1])).shape == (16, 20, 3)


def test_reads_databases_written_like_caffe_and_caffe2_tools(tmp_path):
    colour, gray = random_pixels(6, 9, 3, seed=1), random_pixels(6, 9, 1, seed=2)
    jpeg = make_jpeg(12, 16)
    values = [
        datum_record(0, colour),
        datum_record(1, gray),
        datum_record(2, encoded=jpeg),
        tensorprotos_record(3, encoded=jpeg),
        tensorprotos_record(4, colour),
        tensorprotos_record(5, gray),
        tensorprotos_record(6, colour, as_float=True),
    ]
    expected = [
        colour,
        np.repeat(gray, 3, axis=2),
        np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB")),
    ]
    expected = expected + [expected[2], colour, expected[1], colour]
    for db_type in ("lmdb", "leveldb"):
        db = write_db(
            str(tmp_path / db_type),
            db_type,
            [(caffe_key(i, f"x/{i}.jpg"), value) for i, value in enumerate(values)],
        )
        for index, pixels in enumerate(expected):
            np.testing.assert_array_equal(
                _dump(db, db_type, index, str(tmp_path / "o.png")), pixels
            )


def test_inspect_counts_planted_corrupt_records(tmp_path, capsys):
    good = [datum_record(i % 3, encoded=make_jpeg(20, 30, seed=i)) for i in range(6)]
    mismatch = protos.Datum(channels=3, height=4, width=4, data=bytes(47), label=2)
    bad = {
        b"90_garbage": b"\x99\x98 not a proto",
        b"91_truncated": datum_record(1, encoded=make_jpeg(32, 32)[:-100]),
        b"92_mismatch": mismatch.SerializeToString(),
    }
    records = [(caffe_key(i, "ok.jpg"), value) for i, value in enumerate(good)]
    records += list(bad.items()) + [(b"93_raw", tensorprotos_record(0, random_pixels(5, 4, 1)))]
    db = write_db(str(tmp_path / "db"), "leveldb", records)
    assert main(["inspect", db, "--db_type", "leveldb", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["records"] == 10 and report["inspected"] == 10
    assert report["failed"]["count"] == 3
    assert [entry["key"] for entry in report["failed"]["first"]] == [key.decode() for key in bad]
    assert report["formats"] == {"datum": 6 + 1, "tensorprotos": 1}  # the truncated JPEG parses
    assert report["storage"] == {"encoded": 7, "raw": 1}
    assert report["encodings"] == {"JPEG": 6}
    assert report["channels"] == {"3": 6, "1": 1}
    assert report["labels"]["counts"] == {"0": 3, "1": 3, "2": 2}
    assert (report["width"], report["height"]) == ({"min": 4, "max": 30}, {"min": 5, "max": 20})
    assert (
        main(
            [
                "inspect",
                db,
                "--db_type",
                "leveldb",
                "--sheet",
                str(tmp_path / "s.png"),
                "--sheet_count",
                "4",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "failed      3" in text and "91_truncated" in text and "WARNING" in text
    with Image.open(tmp_path / "s.png") as sheet:
        assert sheet.size == (4 * 96, 110)


def test_inspect_warns_when_every_label_is_the_same(tmp_path, capsys):
    db = write_db(
        str(tmp_path / "db"),
        "lmdb",
        [(caffe_key(i, "a"), datum_record(0, random_pixels(2, 2))) for i in range(3)],
    )
    assert main(["inspect", db]) == 0
    assert "every record has label 0" in capsys.readouterr().out


def test_create_refuses_to_overwrite_without_the_flag(tmp_path, capsys):
    write_class_folders(str(tmp_path / "images"), 2, 1)
    db = str(tmp_path / "db")
    assert main(["create", str(tmp_path / "images"), db]) == 0
    before = _stored_values(db, "lmdb")
    assert main(["create", str(tmp_path / "images"), db, "--raw"]) == 2
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert _stored_values(db, "lmdb") == before
    assert main(["create", str(tmp_path / "images"), db, "--raw", "--overwrite"]) == 0
    assert parse_record(_stored_values(db, "lmdb")[0][1]).pixels is not None
    assert sorted(os.listdir(tmp_path)) == ["db", "db.labels.txt", "images"]


def test_the_labels_file_beside_the_target_is_replaced_only_with_overwrite(tmp_path, capsys):
    write_class_folders(str(tmp_path / "images"), 2, 1)
    (tmp_path / "list.txt").write_text("class_0/img_0.jpg 0\n")
    db, labels = str(tmp_path / "db"), tmp_path / "db.labels.txt"
    labels.write_text("0 someone's\n")  # left by an earlier DB there, or written by hand
    assert main(["create", str(tmp_path / "images"), db]) == 2
    assert "db.labels.txt already exists (an earlier database's labels); pass --overwrite" in (
        capsys.readouterr().err
    )
    assert sorted(os.listdir(tmp_path)) == ["db.labels.txt", "images", "list.txt"]
    assert main(["create", str(tmp_path / "images"), db, "--overwrite"]) == 0
    assert labels.read_text() == "0 class_0\n1 class_1\n"
    # A DB made anew from a list file has no class names: the replaced DB's are not left beside it.
    list_create = ["create", "--list_file", str(tmp_path / "list.txt"), "--root"]
    assert main([*list_create, str(tmp_path / "images"), db, "--overwrite"]) == 0
    assert sorted(os.listdir(tmp_path)) == ["db", "images", "list.txt"]


@pytest.mark.parametrize("command", ["create", "copy"])
def test_a_labels_path_that_is_no_file_is_refused_before_anything_is_built(
    tmp_path, capsys, command
):
    write_class_folders(str(tmp_path / "images"), 2, 1)
    assert main(["create", str(tmp_path / "images"), str(tmp_path / "source")]) == 0
    source = {"create": str(tmp_path / "images"), "copy": str(tmp_path / "source")}[command]
    (tmp_path / "db.labels.txt").mkdir()
    assert main([command, source, str(tmp_path / "db"), "--overwrite"]) == 2
    assert "db.labels.txt, where this database's labels file goes, is not a regular file" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "db").exists() and (tmp_path / "db.labels.txt").is_dir()


def test_list_file_with_a_missing_image_skips_it_and_says_so(tmp_path, caplog, capsys):
    write_class_folders(str(tmp_path / "images"), 2, 1)
    (tmp_path / "images" / "junk.txt").write_text("not an image")
    (tmp_path / "list.txt").write_text(
        "class_0/img_0.jpg 4\nmissing dir/gone.jpg 7\njunk.txt 1\nclass_1/img_0.jpg 5\n"
    )
    db = str(tmp_path / "db")
    with caplog.at_level(logging.WARNING):
        assert (
            main(
                [
                    "create",
                    "--list_file",
                    str(tmp_path / "list.txt"),
                    "--root",
                    str(tmp_path / "images"),
                    db,
                    "--db_type",
                    "leveldb",
                ]
            )
            == 0
        )
    assert "missing dir/gone.jpg: cannot read the file" in caplog.text
    assert "junk.txt: not a readable image" in caplog.text
    assert "skipped 2 files" in capsys.readouterr().out
    stored = _stored_values(db, "leveldb")
    assert [key for key, _ in stored] == [
        b"00000000_class_0/img_0.jpg",
        b"00000003_class_1/img_0.jpg",
    ]
    assert [parse_record(value).label for _, value in stored] == [4, 5]
    assert not os.path.exists(db + ".labels.txt")


def test_failed_create_leaves_no_database_behind(tmp_path, capsys):
    (tmp_path / "images" / "class_0").mkdir(parents=True)
    (tmp_path / "images" / "class_0" / "a.jpg").write_bytes(b"broken")
    assert main(["create", str(tmp_path / "images"), str(tmp_path / "db")]) == 2
    assert "none of the 1 images could be read" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["images"]


def test_dump_and_options_report_bad_requests(tmp_path, capsys):
    db = write_db(str(tmp_path / "db"), "lmdb", [(b"k", datum_record(0, random_pixels(2, 2)))])
    assert main(["dump", db, "--index", "1", "--out", str(tmp_path / "o.png")]) == 2
    assert "out of range" in capsys.readouterr().err
    assert main(["dump", db, "--key", "k", "--out", str(tmp_path / "o.png")]) == 0
    assert "key k  label 0" in capsys.readouterr().out
    with pytest.raises(SystemExit) as caught:
        main(["create", str(tmp_path), str(tmp_path / "x"), "--resize_height", "5"])
    assert caught.value.code == 2


@pytest.mark.skipif(
    not os.path.isdir(os.path.join(SAMPLE_DATA, "train_lmdb")),
    reason="sample_data not built yet (scripts/make_sample_data.py)",
)
def test_shipped_sample_databases_hold_the_same_records(capsys):
    for split, per_class in [("train", 80), ("test", 20)]:
        lmdb_values = _stored_values(os.path.join(SAMPLE_DATA, f"{split}_lmdb"), "lmdb")
        assert lmdb_values == _stored_values(
            os.path.join(SAMPLE_DATA, f"{split}_leveldb"), "leveldb"
        )
        assert main(["inspect", os.path.join(SAMPLE_DATA, f"{split}_lmdb"), "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["failed"]["count"] == 0 and report["formats"] == {"datum": 10 * per_class}
        assert report["labels"]["counts"] == {str(label): per_class for label in range(10)}


def test_paths_that_cannot_be_written_are_refused_before_any_work(tmp_path, capsys):
    source = tmp_path / "images" / "cat"
    source.mkdir(parents=True)
    assert main(["create", str(tmp_path / "images"), str(tmp_path / "no" / "such" / "db")]) == 2
    assert "is not a writable directory" in capsys.readouterr().err
    empty = write_db(str(tmp_path / "one"), "lmdb", [(b"0", datum_record(0, encoded=make_jpeg()))])
    for sheet in (str(tmp_path / "sheet.nosuchformat"), str(tmp_path / "missing" / "sheet.png")):
        assert main(["inspect", empty, "--sheet", sheet]) == 2
        assert "give an image path" in capsys.readouterr().err


@pytest.mark.parametrize(
    "content, expected",
    [
        ("a.jpg 1\nb.jpg 2147483648\n", "line 2 is 'b.jpg 2147483648'"),
        ("a.jpg -1\n", "line 1 is 'a.jpg -1'"),
        ("\na.jpg one\n", "line 2 is 'a.jpg one'"),
        ("a.jpg 1\nno_label.jpg\n", "line 2 is 'no_label.jpg'"),
        ("a.jpg \u00b2\n", "line 1 is 'a.jpg \u00b2'"),  # a digit to str.isdigit, not to int()
        (b"a.jpg 1\n\xff\xfe\x00b.jpg 2\n", "is not UTF-8 text (byte 8)"),
        (b"\x00" * 64, "holds NUL bytes"),
        ("", "names no images"),
    ],
    ids=[
        "beyond-int32",
        "negative",
        "not-a-number",
        "no-label",
        "unicode-digit",
        "binary",
        "nul-bytes",
        "empty",
    ],
)
def test_bad_list_files_get_one_line(tmp_path, capsys, content, expected):
    list_file = tmp_path / "list.txt"
    list_file.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert main(["create", "--list_file", str(list_file), str(tmp_path / "db")]) == 2
    error = capsys.readouterr().err
    assert len(error.splitlines()) == 1 and expected in error, error
    assert sorted(os.listdir(tmp_path)) == ["list.txt"]


def _png_16_bit(samples: np.ndarray) -> bytes:
    """A 16-bit PNG of HxW (gray) or HxWx3 (RGB) uint16 samples, written chunk by chunk: Pillow
    writes 16-bit gray but no 16-bit colour."""
    height, width = samples.shape[:2]
    colour_type = 2 if samples.ndim == 3 else 0
    rows = samples.astype(">u2").reshape(height, -1).tobytes()
    stride = len(rows) // height
    raw = b"".join(b"\x00" + rows[row * stride : (row + 1) * stride] for row in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    header = struct.pack(">IIBBBBB", width, height, 16, colour_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


def _one_image_db(tmp_path, name: str, data: bytes, *flags: str) -> np.ndarray:
    """What the trainer sees (RGB) of `data` stored by create with `flags`."""
    folder = tmp_path / name / "class_0"
    folder.mkdir(parents=True)
    (folder / "image").write_bytes(data)
    db = str(tmp_path / f"{name}_db")
    assert main(["create", str(tmp_path / name), db, *flags]) == 0
    return _dump(db, "lmdb", 0, str(tmp_path / f"{name}.png"))


def test_16_bit_images_keep_their_high_byte_as_opencv_imread(tmp_path):
    gradient = np.linspace(0, 65535, 256).round().astype(np.uint16).reshape(4, 64)  # full range
    gray16 = io.BytesIO()
    Image.fromarray(gradient).save(gray16, "PNG")  # mode I;16
    colour = np.stack([gradient, gradient[::-1], np.full_like(gradient, 40000)], axis=2)
    for storage in ([], ["--raw"]):
        pixels = _one_image_db(tmp_path, f"gray{len(storage)}", gray16.getvalue(), *storage)
        np.testing.assert_array_equal(pixels, np.repeat((gradient >> 8)[:, :, None], 3, axis=2))
        assert len(np.unique(pixels)) == 256  # scaled, not clipped to white
        pixels = _one_image_db(tmp_path, f"rgb{len(storage)}", _png_16_bit(colour), *storage)
        np.testing.assert_array_equal(pixels, (colour >> 8).astype(np.uint8))


@pytest.mark.parametrize("mode", ["RGBA", "LA", "P", "1", "CMYK"])
def test_other_modes_become_8_bit_rgb_as_opencv_imread(tmp_path, mode):
    rgb = smooth_pixels(8, 12)
    image = Image.fromarray(rgb).convert(mode)
    if mode in ("RGBA", "LA"):
        image.putalpha(Image.fromarray(np.full((8, 12), 7, np.uint8)))  # nearly transparent
    buffer = io.BytesIO()
    image.save(buffer, "JPEG" if mode == "CMYK" else "PNG")
    pixels = _one_image_db(tmp_path, "one", buffer.getvalue(), "--raw")
    # Alpha dropped (not blended), palette expanded, gray replicated, CMYK converted.
    expected = np.asarray(
        Image.open(io.BytesIO(buffer.getvalue()))
        .convert("L" if mode in ("LA", "1") else "RGB")
        .convert("RGB")
    )
    np.testing.assert_array_equal(pixels, expected)
    if mode == "RGBA":
        np.testing.assert_array_equal(pixels, rgb)


def test_exif_orientation_is_applied_when_pixels_are_made_and_the_file_is_not_kept(tmp_path):
    stored = smooth_pixels(32, 48)  # 48 wide as stored; orientation 6: upright it is 32 x 48
    exif = Image.Exif()
    exif[0x0112] = 6
    rotated = io.BytesIO()
    Image.fromarray(stored).save(rotated, "JPEG", quality=95, exif=exif)
    decoded = Image.open(io.BytesIO(rotated.getvalue()))
    upright = np.asarray(ImageOps.exif_transpose(decoded).convert("RGB"))
    assert upright.shape == (48, 32, 3)
    np.testing.assert_array_equal(
        _one_image_db(tmp_path, "raw", rotated.getvalue(), "--raw"), upright
    )
    np.testing.assert_array_equal(
        _one_image_db(tmp_path, "png", rotated.getvalue(), "--encode_type", "png"), upright
    )
    # Encoded as it was, the file would be read sideways (the trainer's decoders ignore EXIF):
    # create writes it upright, as a new JPEG without the tag.
    kept = _one_image_db(tmp_path, "jpg", rotated.getvalue())
    assert kept.shape == (48, 32, 3)
    assert np.abs(kept.astype(int) - upright).mean() < 3
    record = parse_record(_stored_values(str(tmp_path / "jpg_db"), "lmdb")[0][1])
    assert 0x0112 not in Image.open(io.BytesIO(encoded_of(record))).getexif()


def damaged_tiff() -> bytes:
    """An LZW TIFF whose strip is scrambled: libtiff writes its complaint to stderr itself."""
    buffer = io.BytesIO()
    Image.fromarray(smooth_pixels(64, 80, seed=1)).save(buffer, "TIFF", compression="tiff_lzw")
    data = bytearray(buffer.getvalue())
    data[8:208] = bytes(i * 37 % 256 for i in range(200))  # the strip follows the 8-byte header
    return bytes(data)


def test_a_bad_records_library_noise_is_left_out_of_its_one_line(tmp_path, capfd, caplog):
    """What libtiff prints and Pillow warns of a damaged TIFF goes unseen: dump's error is one
    line naming the record, create's one warning naming the file."""
    tiff = damaged_tiff()
    db = write_db(str(tmp_path / "db"), "lmdb", [(b"bad_tiff", datum_record(0, encoded=tiff))])
    assert main(["dump", db, "--index", "0", "--out", str(tmp_path / "o.png")]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and "error: record bad_tiff: cannot decode" in err
    images = tmp_path / "images" / "class_0"
    images.mkdir(parents=True)
    (images / "bad.tif").write_bytes(tiff)
    (images / "good.jpg").write_bytes(make_jpeg())
    with caplog.at_level(logging.WARNING):
        assert main(["create", str(tmp_path / "images"), str(tmp_path / "created")]) == 0
    assert capfd.readouterr().err == ""
    assert [record.message.split(":")[0] for record in caplog.records] == [
        f"skipped {images / 'bad.tif'}"
    ]


def test_a_decompression_bomb_is_copied_as_it_is_and_dump_refuses_it(tmp_path, capsys):
    bomb = bytearray(make_jpeg(16, 16))
    frame = bomb.index(b"\xff\xc0")
    bomb[frame + 5 : frame + 9] = (65528).to_bytes(2, "big") * 2  # height, width
    records = [
        (b"good", datum_record(0, encoded=make_jpeg())),
        (b"bomb", datum_record(1, encoded=bytes(bomb))),
    ]
    source = write_db(str(tmp_path / "source"), "lmdb", records)
    copied = str(tmp_path / "copied")
    assert main(["copy", source, copied, "--restart_markers"]) == 0
    assert _stored_values(copied, "lmdb")[0] == records[1]  # kept as it is ("bomb" sorts first)
    assert main(["dump", copied, "--key", "bomb", "--out", str(tmp_path / "o.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "record bomb: the record's image claims 65528x65528" in err
