"""Shared fixtures (small real image databases in temporary directories), and the lanes: tests in
unit/ start no process and train nothing; system/ (runs, launchers, servers, namespaces) and gpu/
are marked `system`, so `pytest -m "not system"` is the fast inner loop."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support.dbfactory import write_image_db

_SYSTEM_LANES = ("system", "gpu")


def pytest_collection_modifyitems(items):
    """Every test under tests/system or tests/gpu carries the `system` marker."""
    for item in items:
        if item.path.parent.name in _SYSTEM_LANES:
            item.add_marker(pytest.mark.system)


@pytest.fixture(scope="module")
def module_tmp_path(request, tmp_path_factory):
    """A directory for what one module's tests share, removed when the module ends unless one of
    its tests failed. Runs write ResNet checkpoints of 50-200 MB each, and CI's disk is small: the
    whole suite kept everything it wrote (14 GB) until pyproject's tmp_path_retention_policy."""
    failed_before = request.session.testsfailed
    path = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2].removeprefix("test_"))
    yield path
    if request.session.testsfailed == failed_before:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def image_db(tmp_path):
    """make(name, num_records, num_labels, db_type="lmdb") -> path of a DB of JPEG Datum records.

    Record i has label i % num_labels and key "%08d_img{i}.jpg", so tests can count what was read.
    """

    def make(name: str, *args, **kwargs) -> str:
        return write_image_db(str(tmp_path / name), *args, **kwargs)

    return make


@pytest.fixture
def tmpfs(tmp_path):
    """mount(name, size) -> a directory in tmp_path with a real tmpfs of `size` (e.g. "256k")
    mounted on it, unmounted after the test; the test is skipped where mounting is refused."""
    mounted = []

    def mount(name: str, size: str) -> str:
        directory = tmp_path / name
        directory.mkdir()
        refused = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
            capture_output=True,
        )
        if refused.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {refused.stderr.decode().strip()}")
        mounted.append(directory)
        return str(directory)

    yield mount
    for directory in mounted:
        # Lazy: a process the test killed may still be letting go of a file there.
        subprocess.run(["umount", "-l", str(directory)], check=True)
