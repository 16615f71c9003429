"""resnet50-plot as a process: --help imports no matplotlib, python -m runs headless without a
traceback, an output that cannot be written exits 2 and keeps the old PNG."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
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
        (full / "out.png", "No space left on device"),
        (read_only / "out.png", "Read-only file system"),
        (tmp_path / "missing" / "out.png", "No such file or directory"),
        (tmp_path / "a_directory.png", "Is a directory"),
    ]
    for output, reason in cases:
        assert main([str(ours_log(tmp_path)), "-o", str(output)]) == 2
        assert capsys.readouterr().err.splitlines() == [
            f"resnet50-plot: error: cannot write {output}: {reason}; choose another --output"
        ]
    assert (full / "out.png").read_bytes() == old_png  # whole, not half overwritten
    assert sorted(os.listdir(full)) == ["filler", "out.png"]
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["a_directory.png", "full", OURS_NAME, "read_only"]
    )


def test_help_does_not_import_matplotlib():
    """--help answers at once: matplotlib (half a second) loads only once the arguments hold."""
    assert imported_by("resnet50_trainer.tools.plot.command", [["--help"]], ("matplotlib",)) == []
