"""scripts/scaling_model.py run as a script: a row for every GPU, dtype and count."""

from __future__ import annotations

import os
import subprocess
import sys

from trainer_runs import REPOSITORY

sys.path.insert(0, os.path.join(REPOSITORY, "scripts"))


import scaling_model  # noqa: E402


def test_the_script_prints_a_row_for_every_gpu_dtype_and_count():
    done = subprocess.run(
        [sys.executable, os.path.join(REPOSITORY, "scripts", "scaling_model.py")],
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
