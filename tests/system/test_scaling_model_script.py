"""benchmarks/scaling_model.py run as a module (`python -m benchmarks.scaling_model`): a row for
every GPU, dtype and count."""

from __future__ import annotations

import subprocess
import sys

from benchmarks import scaling_model
from tests.support.trainer_runs import REPOSITORY


def test_the_script_prints_a_row_for_every_gpu_dtype_and_count():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.scaling_model"],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "%" in line]
    expected = (
        len(scaling_model.GPUS) * len(scaling_model.GRADIENT_BYTES) * len(scaling_model.GPU_COUNTS)
    )
    assert len(rows) == expected
    for row in rows:
        cells = [float(cell.strip(" %")) for cell in row.strip("|").split("|")[3:]]
        assert len(cells) == len(scaling_model.LINKS_GBPS)
        assert all(0 < cell <= 100 for cell in cells), row
