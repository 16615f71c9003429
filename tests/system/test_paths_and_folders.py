"""Paths and folders a user's machine really has (issue 44), each in one line or working: a DB
this user may not reach or read (permission denied named as such, with the user), a DB in a folder
whose name is not UTF-8 (trained on, inspected and written), a temporary folder too full for a
LevelDB's snapshot (named, nothing left there), a current folder removed after the shell entered
it (absolute paths work, a relative one is named)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable

import pytest

from resnet50_trainer.data.formats.databases import open_database
from resnet50_trainer.errors import UserError
from resnet50_trainer.path_words import shown
from tests.support.run_logs import ours_log
from tests.support.trainer_runs import (
    fill_up,
    one_error_line,
    run_trainer,
    trainer_command,
    trainer_env,
)

SETPRIV = shutil.which("setpriv")
# Root without the capabilities that let it past a folder's or file's mode: permissions then
# hold for it as for any user (files owned by another user).
WITHOUT_OVERRIDE = [
    "--bounding-set=-dac_override,-dac_read_search",
    "--inh-caps=-dac_override,-dac_read_search",
]
OTHER_USER = 65534  # nobody


def as_root_without_override(command: list[str]) -> subprocess.CompletedProcess:
    if os.geteuid() != 0 or SETPRIV is None:
        pytest.skip("needs root and setpriv, to drop the capabilities that override permissions")
    return subprocess.run(
        [SETPRIV, *WITHOUT_OVERRIDE, *command],
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def owned_by_another_user(path, mode: int) -> None:
    os.chown(path, OTHER_USER, OTHER_USER)
    os.chmod(path, mode)


@pytest.mark.parametrize("where", ["a folder on the way", "the DB's folder", "data.mdb"])
def test_a_db_this_user_may_not_read_is_named_as_such(image_db, tmp_path, where):
    locked = tmp_path / "locked"
    locked.mkdir()
    database = image_db("locked/train", 16, 4)
    refused, verb = {
        "a folder on the way": (str(locked), "enter"),
        "the DB's folder": (database, "enter"),
        "data.mdb": (os.path.join(database, "data.mdb"), "read"),
    }[where]
    owned_by_another_user(refused, 0o700 if verb == "enter" else 0o600)
    commands = [
        trainer_command("--train_data", database, "--log_dir", str(tmp_path / "logs")),
        [sys.executable, "-m", "resnet50_trainer.tools.db", "inspect", database],
    ]
    for command in commands:
        done = as_root_without_override(command)
        assert done.returncode == 2, done.stderr
        line = one_error_line(done.stderr)
        assert (
            f"permission denied: user root may not {verb} {shown(refused)} (owner nobody, "
            f"mode {0o700 if verb == 'enter' else 0o600:o}): ask its owner for access" in line
        ), line


def test_a_log_folder_this_user_may_not_write_in_is_named_as_such(tmp_path):
    folder = tmp_path / "theirs"
    folder.mkdir()
    owned_by_another_user(folder, 0o755)
    logs = folder / "logs"
    done = as_root_without_override(trainer_command("--train_data", "null", "--log_dir", str(logs)))
    assert done.returncode == 2, done.stderr
    assert one_error_line(done.stderr).endswith(
        f"error: --log_dir {shown(str(logs))} cannot be written: permission denied: user root may "
        f"not write in {shown(str(folder))} (owner nobody, mode 755): ask its owner for access, or "
        "run as a user who has it"
    )


@pytest.mark.parametrize("flag", ["--load_model_path", "--init_model"])
def test_a_checkpoint_this_user_may_not_read_is_named_as_such(tmp_path, flag):
    """Not "is not a readable checkpoint (PermissionError: ...)", which blamed the file."""
    checkpoint = tmp_path / "theirs.pt"
    checkpoint.write_bytes(b"a checkpoint")
    owned_by_another_user(checkpoint, 0o600)
    done = as_root_without_override(
        trainer_command("--train_data", "null", flag, str(checkpoint), "--log_dir", str(tmp_path))
    )
    assert done.returncode == 2, done.stderr
    assert one_error_line(done.stderr).endswith(
        f"error: {flag} {shown(str(checkpoint))} cannot be read: permission denied: user root may "
        f"not read {shown(str(checkpoint))} (owner nobody, mode 600): ask its owner for access, "
        "or run as a user who has it"
    )


def test_a_db_in_a_folder_whose_name_is_not_utf8_is_read(image_db, tmp_path):
    """The OS takes any bytes but / and NUL in a name; Python gives such a name with surrogates,
    which LMDB's and LevelDB's bindings refuse to encode, and /proc/self/maps then holds it."""
    folder = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"\xff\xfe"))
    os.mkdir(folder)
    database = image_db("train", 16, 4)
    moved = os.path.join(folder, "train")
    os.rename(database, moved)
    done = run_trainer(
        *("--train_data", moved, "--test_data", moved, "--num_epochs", "1"),
        *("--log_dir", os.path.join(folder, "logs")),
    )
    assert done.returncode == 0, done.stderr
    assert "Epoch 1: loss" in done.stderr
    copy = os.path.join(folder, "copy")
    for command in (
        ["copy", moved, copy, "--db_type", "leveldb"],
        ["inspect", copy, "--db_type", "leveldb"],
    ):
        done = subprocess.run(
            [sys.executable, "-m", "resnet50_trainer.tools.db", *command],
            env=trainer_env(),
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    assert b"records     16" in done.stdout


@pytest.mark.parametrize("pages_free", [0, 1, 3])
def test_a_full_temporary_folder_is_named_for_a_leveldb(image_db, tmpfs, monkeypatch, pages_free):
    """A LevelDB is read through a snapshot in the temporary folder: with no room there, for the
    folder itself, its copies or what LevelDB writes as it opens them, one line names the folder,
    and nothing of the snapshot is left."""
    database = image_db("train", 8, 2, db_type="leveldb")
    scratch = tmpfs("scratch", "64k")
    fill_up(scratch, leave_bytes=pages_free * 4096)
    monkeypatch.setattr(tempfile, "tempdir", scratch)
    with pytest.raises(UserError) as refused:
        open_database(database, "leveldb")
    assert str(refused.value).startswith(
        f"cannot open LevelDB {shown(database)}: the temporary folder {shown(scratch)} cannot "
        "take its snapshot (No space left on device; "
    ), refused.value
    assert str(refused.value).endswith("free space there or point TMPDIR at a folder with room")
    assert os.listdir(scratch) == ["filler"]


def in_a_removed_folder(folder) -> Callable[[], None]:
    """What a shell does before it runs a command in a folder removed after it entered it."""

    def enter_and_remove() -> None:
        os.makedirs(folder)
        os.chdir(folder)
        os.rmdir(folder)

    return enter_and_remove


def test_a_removed_current_folder_takes_absolute_paths_and_names_a_relative_one(image_db, tmp_path):
    """torch (its oneMKL) could not even be loaded there ("Cannot load libtorch_cpu.so", exit
    2, with absolute paths too); resnet50-db's relative paths were FileNotFoundError tracebacks."""
    database = image_db("train", 16, 4)
    runs = {
        "trains": trainer_command(
            *("--train_data", "null", "--epoch_size", "16", "--num_epochs", "1"),
            *("--log_dir", str(tmp_path / "logs")),
        ),
        "refused": trainer_command("--train_data", "null"),  # --log_dir's default: .
        "copies": [sys.executable, "-m", "resnet50_trainer.tools.db", "copy", database]
        + [str(tmp_path / "copy")],
        "refuses": [sys.executable, "-m", "resnet50_trainer.tools.db", "inspect", "train"],
        "plot refuses": [sys.executable, "-m", "resnet50_trainer.tools.plot", ours_log(tmp_path)],
    }
    done = {
        what: subprocess.run(
            command,
            env=trainer_env(),
            capture_output=True,
            text=True,
            timeout=240,
            preexec_fn=in_a_removed_folder(tmp_path / what),
        )
        for what, command in runs.items()
    }
    for what in ("trains", "copies"):
        assert done[what].returncode == 0, done[what].stderr
    for what, argument, path in (
        ("refused", "--log_dir", "."),
        ("refuses", "DB", "train"),
        ("plot refuses", "-o/--output", "plot.png"),  # its default: never /plot.png
    ):
        assert done[what].returncode == 2, done[what].stderr
        assert (
            f"error: argument {argument}: {path} is relative to the current folder, which no "
            "longer exists (removed after the shell entered it): cd into an existing folder, or "
            "give an absolute path"
        ) in one_error_line(done[what].stderr)
