"""A path in a one-line report (issue 44): shown quoted as ls quotes it for a shell where it holds
anything a shell would take apart (a newline, an escape sequence, a byte that is not UTF-8), and
why it cannot be reached where the system refuses it (a link loop, a file on the way) named as
such; resnet50-db create and copy write through a link to a DB. In this process."""

from __future__ import annotations

import os

import pytest

from resnet50_trainer.data.formats.databases import open_database
from resnet50_trainer.errors import error_line
from resnet50_trainer.path_words import shown, unreachable
from resnet50_trainer.tools.db.command import main as db_main
from tests.support.dbfactory import write_class_folders, write_image_db
from tests.support.trainer_runs import in_process, refused_in_process


@pytest.mark.parametrize(
    "path, expected",
    [
        ("/data/train_lmdb", "/data/train_lmdb"),
        ("/data/my db", "'/data/my db'"),
        ("it's", "'it'\\''s'"),
        ("/a\nb\x1b[31m", "'/a'$'\\n''b'$'\\033''[31m'"),
        (os.fsdecode(b"/p/\xff\xfe/db"), "'/p/'$'\\377\\376''/db'"),
        ("caf\u00e9", "caf\u00e9"),  # printable: as a UTF-8 terminal shows it, as ls does
        ("", "''"),
    ],
)
def test_a_path_is_shown_as_ls_quotes_it(path, expected):
    assert shown(path) == expected


def test_a_path_with_a_newline_and_an_escape_stays_on_its_line(capsys, tmp_path):
    path = str(tmp_path / "a\nb\x1b[2J")
    line = refused_in_process(capsys, "--train_data", path)
    assert f"--train_data {shown(path)} does not exist" in line, line
    assert "\x1b" not in line


@pytest.fixture
def loop(tmp_path) -> str:
    path = tmp_path / "loop"
    path.symlink_to(path)
    return str(path)


def test_a_link_loop_is_named_by_every_command(capsys, tmp_path, loop):
    database = write_image_db(str(tmp_path / "db"), 4, 2)
    said = f"cannot be reached: {shown(loop)} is a symbolic link that leads back to itself"
    for command, *args in [
        ("copy", database, loop),
        ("copy", loop, str(tmp_path / "copy")),
        ("create", str(tmp_path), loop),
        ("inspect", loop),
    ]:
        status, error = in_process(capsys, db_main, command, *args)
        assert status == 2 and len(error.splitlines()) == 1, error
        assert said in error, error
    assert said in refused_in_process(capsys, "--train_data", loop)
    line = refused_in_process(capsys, "--train_data", "null", "--log_dir", loop)
    assert f"--log_dir {shown(loop)} cannot be written: {shown(loop)} is a symbolic link" in line


def test_any_one_line_report_stays_one_line():
    """Where a message holds a newline or an escape that no path rendering caught (a path from a
    file's contents, a library's words), its line still neither ends nor drives the terminal."""
    assert error_line("prog", "a\nb\x1b[2J") == "prog: error: a\\nb\\033[2J"


def test_a_file_on_the_way_is_named(capsys, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    line = refused_in_process(capsys, "--train_data", str(tmp_path / "file" / "db"))
    assert f"{shown(str(tmp_path / 'file'))} is a file, not a folder" in line, line
    assert unreachable(str(tmp_path / "missing" / "db")) is None  # simply not there


@pytest.mark.parametrize("command", ["create", "copy"])
def test_overwrite_through_a_link_replaces_the_db_it_names(capsys, tmp_path, command):
    """The link stays, and the DB it names holds the new records: it is the one replaced."""
    real = write_image_db(str(tmp_path / "real"), 3, 1)
    link = tmp_path / "link"
    link.symlink_to(real)
    if command == "create":
        source = str(tmp_path / "images")
        write_class_folders(source, class_count=1, per_class=5)
    else:
        source = write_image_db(str(tmp_path / "other"), 5, 1)
    status, error = in_process(capsys, db_main, command, source, str(link), "--overwrite")
    assert status == 0, error
    assert link.is_symlink() and os.readlink(link) == real
    with open_database(real, "lmdb") as database:
        assert len(database) == 5


def test_a_device_on_the_way_is_named_and_the_walk_ends():
    """/dev/null/db: the walk up to the part that is no folder stopped only at a regular file, and
    circled at the root for ever."""
    assert unreachable("/dev/null/db") == "/dev/null is not a folder: correct the path"
