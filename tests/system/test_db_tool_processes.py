"""resnet50-db as a process: a full disk (for a DB, an image, a contact sheet), a FIFO list file,
a signal mid-create, what --help imports, irregular files skipped, a seeded shuffle with input
workers, an LMDB another process writes."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resnet50_trainer.data.formats.databases import open_database
from resnet50_trainer.tools.db.command import main
from tests.support.dbfactory import (
    LiveLmdbWriter,
    encode_image,
    random_pixels,
    write_class_folders,
)
from tests.support.trainer_runs import children, fill_up, imported_by, trainer_env, wait_for


def _stored_values(db, db_type):
    with open_database(db, db_type) as database:
        return [(key, database.get(key)) for key in database.keys()]


def test_shuffle_is_seeded_and_workers_do_not_change_the_result(tmp_path):
    write_class_folders(str(tmp_path / "images"), 3, 4)
    results = []
    for name, workers in [("one", "1"), ("two", "2")]:
        db = str(tmp_path / name)
        assert (
            main(
                [
                    "create",
                    str(tmp_path / "images"),
                    db,
                    "--shuffle",
                    "--seed",
                    "3",
                    "--num_workers",
                    workers,
                    "--raw",
                ]
            )
            == 0
        )
        results.append(_stored_values(db, "lmdb"))
    assert results[0] == results[1]
    paths = [key.split(b"_", 1)[1] for key, _ in results[0]]
    assert paths != sorted(paths) and len(set(paths)) == 12


def _create(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`resnet50-db create` in its own process: a hang is a failed test, not a hung suite."""
    return subprocess.run(
        [sys.executable, "-m", "resnet50_trainer.tools.db", "create", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=trainer_env(),
    )


def test_only_regular_files_are_read_the_rest_is_named_and_skipped(tmp_path):
    write_class_folders(str(tmp_path / "images"), 2, 1)
    folder = tmp_path / "images" / "class_0"
    os.mkfifo(folder / "pipe.jpg")
    os.mknod(folder / "null.jpg", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # as /dev/null
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(folder / "sock.jpg"))
        (folder / "to_pipe.jpg").symlink_to(folder / "pipe.jpg")
        (folder / "dangling.jpg").symlink_to(tmp_path / "gone.jpg")
        (folder / "to_dir").symlink_to(tmp_path / "images" / "class_1")
        (folder / "to_image.jpg").symlink_to(folder / "img_0.jpg")
        (tmp_path / "list.txt").write_text("class_0/pipe.jpg 0\nclass_1 1\nclass_0/img_0.jpg 2\n")
        made = _create(str(tmp_path / "images"), str(tmp_path / "db"))
        listed = _create(
            "--list_file",
            str(tmp_path / "list.txt"),
            "--root",
            str(tmp_path / "images"),
            str(tmp_path / "listed"),
        )
    assert made.returncode == 0, made.stderr
    for name, kind in [
        ("pipe.jpg", "a FIFO"),
        ("null.jpg", "a character device"),
        ("sock.jpg", "a socket"),
        ("to_pipe.jpg", "a FIFO"),
        ("to_dir", "a directory"),
    ]:
        assert f"class_0/{name}: cannot read the file ({kind}, not a regular file)" in made.stderr
    assert "dangling.jpg: cannot read the file (No such file or directory)" in made.stderr
    assert "skipped 6 files" in made.stdout and "Traceback" not in made.stderr
    assert [key for key, _ in _stored_values(str(tmp_path / "db"), "lmdb")] == [
        b"00000001_class_0/img_0.jpg",
        b"00000006_class_0/to_image.jpg",
        b"00000008_class_1/img_0.jpg",
    ]
    assert listed.returncode == 0, listed.stderr
    assert "pipe.jpg: cannot read the file (a FIFO, not a regular file)" in listed.stderr
    assert "class_1: cannot read the file (a directory, not a regular file)" in listed.stderr
    assert len(_stored_values(str(tmp_path / "listed"), "lmdb")) == 1


def test_a_list_file_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "list.txt")
    made = _create("--list_file", str(tmp_path / "list.txt"), str(tmp_path / "db"), timeout=60)
    assert made.returncode == 2
    assert made.stderr.strip().endswith("(a FIFO, not a regular file); check the path")


def _create_blocked_mid_write(tmp_path: Path, workers: str = "1") -> subprocess.Popen:
    """`create` into tmp_path/out/db, deterministically mid-write once its folder is there: every
    missing file in the list is named on stderr, which nobody reads, so create blocks once the
    pipe is full, with its database half written."""
    write_class_folders(str(tmp_path / "images"), 1, 4)
    lines = [f"class_0/img_{index}.jpg 0" for index in range(4)]
    lines += [f"missing/{index:05d}_{'x' * 60}.jpg 1" for index in range(3000)]  # > 64 KiB named
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "out").mkdir(exist_ok=True)
    before = set(os.listdir(tmp_path / "out"))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "resnet50_trainer.tools.db",
            "create",
            "--list_file",
            str(tmp_path / "list.txt"),
            "--root",
            str(tmp_path / "images"),
            str(tmp_path / "out" / "db"),
            "--num_workers",
            workers,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=trainer_env(),
    )
    wait_for(lambda: bool(set(os.listdir(tmp_path / "out")) - before), 60, "the temporary database")
    return process


@pytest.mark.parametrize(
    "signum, workers",
    [(signal.SIGTERM, "1"), (signal.SIGINT, "1"), (signal.SIGTERM, "2"), (signal.SIGHUP, "2")],
)
def test_a_signal_mid_create_removes_the_partial_database(tmp_path, signum, workers):
    process = _create_blocked_mid_write(tmp_path, workers)
    try:
        assert process.poll() is None  # it cannot end before its stderr is read
        workers_pids = children(process.pid)
        os.kill(process.pid, signum)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 128 + signum, stderr
    last = stderr.strip().splitlines()[-1]
    assert last == (
        f"resnet50-db create: error: stopped by {signal.Signals(signum).name}; removed "
        f"the partial database, nothing was written to {tmp_path / 'out' / 'db'}"
    )
    assert "Traceback" not in stderr and "Logging error" not in stderr
    assert os.listdir(tmp_path / "out") == []
    assert not any(os.path.exists(f"/proc/{pid}") for pid in workers_pids)


def test_the_folder_of_a_killed_build_is_removed_by_the_next_build_of_its_target(tmp_path):
    """SIGKILL leaves a build no moment to remove its .DB.partial-* folder: the next build of the
    same target removes it, and leaves alone the folder of a build that still runs."""
    write_class_folders(str(tmp_path / "good"), 1, 2)
    build_again = [str(tmp_path / "good"), str(tmp_path / "out" / "db"), "--overwrite"]
    killed = _create_blocked_mid_write(tmp_path)
    killed.kill()
    killed.communicate(timeout=60)
    (left,) = os.listdir(tmp_path / "out")
    running = _create_blocked_mid_write(tmp_path)
    try:
        for folder in os.listdir(tmp_path / "out"):  # a minute later: both old enough to go
            os.utime(tmp_path / "out" / folder, (time.time() - 61,) * 2)
        assert _create(*build_again).returncode == 0
        (held,) = set(os.listdir(tmp_path / "out")) - {"db", "db.labels.txt"}
        assert held != left and running.poll() is None
    finally:
        running.kill()
        running.communicate(timeout=60)
    os.utime(tmp_path / "out" / held, (time.time() - 61,) * 2)
    assert _create(*build_again).returncode == 0
    assert sorted(os.listdir(tmp_path / "out")) == ["db", "db.labels.txt"]


@pytest.mark.parametrize("db_type", ["lmdb", "leveldb"])
def test_a_full_disk_fails_the_create_in_one_line_and_leaves_nothing(
    tmp_path, capsys, db_type, tmpfs
):
    folder = tmp_path / "images" / "noise"
    folder.mkdir(parents=True)
    for index in range(40):  # 40 x 77 KB of incompressible PNG: more than the 2 MB disk
        (folder / f"{index}.png").write_bytes(
            encode_image(random_pixels(160, 160, seed=index), "PNG")
        )
    two_megabyte_disk = Path(tmpfs("small_disk", "2m"))
    db = str(two_megabyte_disk / "db")
    assert main(["create", str(tmp_path / "images"), db, "--db_type", db_type]) == 2
    error = capsys.readouterr().err
    assert len(error.splitlines()) == 1, error
    # LMDB reports a short write as EIO; LevelDB passes ENOSPC on.
    assert ("Input/output error" if db_type == "lmdb" else "No space left on device") in error
    assert f"beside {db}" in error and "MiB free there" in error and "nothing was written" in error
    assert os.listdir(two_megabyte_disk) == []


def test_a_copy_of_an_lmdb_another_process_writes_is_one_snapshot_of_it(tmp_path, capsys):
    """The copy reads through the writer's reader table (lock.mdb), so the writer leaves its
    pages alone: read without it, the copy aborted on LMDB's assertions (exit 134) in most tries
    and left its .DB.partial-* folder behind."""
    source = str(tmp_path / "source")
    with LiveLmdbWriter(source, 300, nonstop=True):
        for attempt in range(3):
            copy = str(tmp_path / f"copy{attempt}")
            assert main(["copy", source, copy]) == 0, capsys.readouterr().err
            values = [value for _, value in _stored_values(copy, "lmdb")]
            assert len(values) == 300 and len(set(values)) == 1  # one transaction's
    assert sorted(os.listdir(tmp_path)) == ["copy0", "copy1", "copy2", "source"]


def test_an_lmdb_another_process_writes_is_refused_where_its_lock_file_is_not_writable(tmp_path):
    """A reader that cannot register in the writer's reader table cannot keep its pages."""
    source = str(tmp_path / "source")
    as_a_user = []  # root writes any file: it runs without that power
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root, and no setpriv to drop root's powers")
        as_a_user = ["setpriv", "--securebits", "+noroot,+noroot_locked", "--bounding-set", "-all"]
    with LiveLmdbWriter(source, 10):
        os.chmod(os.path.join(source, "lock.mdb"), 0o444)
        done = subprocess.run(
            [*as_a_user, sys.executable, "-m", "resnet50_trainer.tools.db", "inspect", source],
            capture_output=True,
            text=True,
            env=trainer_env(),
            timeout=60,
        )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.splitlines()
    assert f"LMDB {source} is open in another process (pid " in line
    assert "lock.mdb is not writable by you" in line and "once that process has closed it" in line


def test_help_and_the_subcommands_but_bench_do_not_import_torch():
    """resnet50-db --help answers at once: torch (seconds) loads only for bench, when it runs."""
    argvs = [["--help"], ["bench", "--help"], ["bench", "db", "--batch_size", "nan"]]
    assert imported_by("resnet50_trainer.tools.db.command", argvs, ("torch",)) == []


@pytest.mark.parametrize("command", ["dump", "inspect"])
def test_an_image_that_does_not_fit_leaves_the_one_there_whole(tmp_path, capsys, tmpfs, command):
    """dump's --out and inspect's --sheet are written beside their target and renamed over it, as
    resnet50-plot's and resnet50-export's outputs: PIL's save truncated the file there first, and
    a full disk then left a piece of it."""
    database = str(tmp_path / "db")
    write_class_folders(str(tmp_path / "images"), class_count=2, per_class=2, size=64)
    assert main(["create", str(tmp_path / "images"), database]) == 0
    disk = tmpfs("disk", "64k")
    output = Path(disk) / "image.png"
    output.write_bytes(b"an earlier image" * 100)
    fill_up(disk)
    capsys.readouterr()
    arguments = {"dump": ["--index", "0", "--out"], "inspect": ["--sheet"]}[command]
    assert main([command, database, *arguments, str(output)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "cannot be written (No space left on device)" in line, line
    assert output.read_bytes() == b"an earlier image" * 100
    assert sorted(os.listdir(disk)) == ["filler", "image.png"]
