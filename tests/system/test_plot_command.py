"""resnet50-plot as a process: --help imports no matplotlib, python -m runs headless without a
traceback, an output that cannot be written exits 2 and keeps the old PNG; one that is a link is
written through, one that is a pipe or a FIFO written into."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from resnet50_trainer.tools.plot.command import main
from resnet50_trainer.tools.plot.figure import plot_logs
from tests.support.run_logs import OURS_NAME, ours_log
from tests.support.trainer_runs import REPOSITORY, imported_by


def test_module_run_headless_without_traceback(tmp_path):
    environment = dict(os.environ, PYTHONPATH=REPOSITORY)
    for name in ("DISPLAY", "MPLBACKEND"):
        environment.pop(name, None)
    # Plotting must not go through pyplot, which would pick a global backend for the whole process.
    script = (
        "import sys; from resnet50_trainer.tools.plot.command import main; "
        "status = main(sys.argv[1:]); sys.exit(3 if 'matplotlib.pyplot' in sys.modules else status)"
    )
    good = subprocess.run(
        [sys.executable, "-c", script, str(ours_log(tmp_path)), "-o", str(tmp_path / "ok.png")],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )
    assert good.returncode == 0, good.stderr
    assert (tmp_path / "ok.png").is_file()

    missing = tmp_path / "absent.log"
    bad = subprocess.run(
        [sys.executable, "-m", "resnet50_trainer.tools.plot", str(missing)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == [
        f"resnet50-plot: error: {missing}: no such file; pass the path of a run log (*.log)"
    ]


def _mount_tmpfs(directory: Path, options: str) -> None:
    directory.mkdir()
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("mounting a tmpfs is not permitted here")


@pytest.fixture
def small_disks(tmp_path):
    """(full, read_only): a 256 KiB tmpfs holding a finished PNG and filled to the last byte, and
    an empty read-only tmpfs."""
    full, read_only = tmp_path / "full", tmp_path / "read_only"
    _mount_tmpfs(full, "size=256k")
    try:
        _mount_tmpfs(read_only, "ro,size=64k")
        try:
            plot_logs([ours_log(tmp_path)], full / "out.png", dpi=10)
            with open(full / "filler", "wb", buffering=0) as filler:
                with contextlib.suppress(OSError):
                    while True:
                        filler.write(b"\0" * 4096)
            yield full, read_only
        finally:
            subprocess.run(["umount", str(read_only)], check=True)
    finally:
        subprocess.run(["umount", str(full)], check=True)


def test_outputs_that_cannot_be_written_exit_2_and_keep_the_old_png(tmp_path, capsys, small_disks):
    full, read_only = small_disks
    old_png = (full / "out.png").read_bytes()
    (tmp_path / "a_directory.png").mkdir()
    cases = [
        (full / "out.png", "cannot be written (No space left on device)"),
        (read_only / "out.png", "cannot be written (Read-only file system)"),
        (tmp_path / "missing" / "out.png", "cannot be written (No such file or directory)"),
    ]
    for output, reason in cases:
        assert main([str(ours_log(tmp_path)), "-o", str(output)]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"resnet50-plot: error: --output {output} {reason}: choose a writable path with "
            "room for the figure"
        ]
    assert main([str(ours_log(tmp_path)), "-o", str(tmp_path / "a_directory.png")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"resnet50-plot: error: --output {tmp_path / 'a_directory.png'} is a directory: give "
        "the path of the file to write"
    ]
    assert (full / "out.png").read_bytes() == old_png  # whole, not half overwritten
    assert sorted(os.listdir(full)) == ["filler", "out.png"]
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["a_directory.png", "full", OURS_NAME, "read_only"]
    )


def test_help_does_not_import_matplotlib():
    """--help answers at once: matplotlib (half a second) loads only once the arguments hold."""
    assert imported_by("resnet50_trainer.tools.plot.command", [["--help"]], ("matplotlib",)) == []


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_an_output_that_is_a_link_is_written_through(tmp_path, capsys):
    """The link stays and the file it names holds the figure (the link was replaced by a file
    and its target kept the old contents)."""
    target = tmp_path / "figure.png"
    target.write_bytes(b"an earlier figure")
    link = tmp_path / "link.png"
    link.symlink_to(target)
    assert main([str(ours_log(tmp_path)), "-o", str(link)]) == 0, capsys.readouterr().err
    assert link.is_symlink() and target.read_bytes().startswith(PNG_SIGNATURE)
    assert sorted(os.listdir(tmp_path)) == sorted(["figure.png", "link.png", OURS_NAME])


def test_an_output_that_is_a_pipe_is_written_into_never_replaced(tmp_path):
    """A link to /proc/self/fd/1 (this run's stdout, a pipe) and a FIFO: the PNG goes into each,
    and neither becomes a regular file (a 44 MB one was made of the link)."""
    stdout = tmp_path / "stdout.png"
    stdout.symlink_to("/proc/self/fd/1")
    fifo = tmp_path / "fifo.png"
    os.mkfifo(fifo)
    read: list[bytes] = []
    # A daemon: where nothing opens the FIFO to write, the thread waits forever, not the tests.
    reader = threading.Thread(target=lambda: read.append(fifo.read_bytes()), daemon=True)
    reader.start()
    done = {}
    for output in (stdout, fifo):
        done[output] = subprocess.run(
            [sys.executable, "-m", "resnet50_trainer.tools.plot", str(ours_log(tmp_path))]
            + ["-o", str(output)],
            capture_output=True,
            env=dict(os.environ, PYTHONPATH=REPOSITORY),
            timeout=120,
        )
        assert done[output].returncode == 0, done[output].stderr
    reader.join(timeout=30)
    assert done[stdout].stdout.startswith(PNG_SIGNATURE)
    assert read and read[0].startswith(PNG_SIGNATURE)
    assert stdout.is_symlink() and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".partial")]
