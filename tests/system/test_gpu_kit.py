"""The GPU proof kit on a machine without a GPU: scripts/gpu_check.sh says so in one line and
exits 77; scripts/build_wheelhouse.sh's lists hold every runtime dependency that a lent machine's
own packages do not; scripts/gpu_check_table.py makes its table of what the parts left."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

from tests.support.trainer_runs import REPOSITORY

REPO = Path(REPOSITORY)
# What a lent GPU machine has without the wheelhouse (scripts/build_wheelhouse.sh's PREINSTALLED).
PREINSTALLED = {"torch", "torchvision", "pillow", "tqdm", "numpy"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_gpu_check_without_a_gpu_says_so_in_one_line(tmp_path):
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out")},
    )
    assert done.returncode == 77
    assert done.stderr == ""
    assert done.stdout == (
        "gpu_check: no CUDA GPU on this machine (torch.cuda.is_available() is False): "
        "nothing to check\n"
    )
    assert list(tmp_path.iterdir()) == []  # nothing installed, nothing written


def test_gpu_check_refuses_an_unknown_argument_in_one_line(tmp_path):
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_check.sh"), "--fast"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "unknown argument '--fast'" in done.stderr


def wheelhouse_lists() -> dict[str, set[str]]:
    script = (REPO / "scripts" / "build_wheelhouse.sh").read_text()
    lists = dict(re.findall(r'^([A-Z_]+)="([^"]*)"$', script, re.MULTILINE))
    return {
        name: {canonical(package) for package in value.split()} for name, value in lists.items()
    }


def test_the_wheelhouse_covers_every_runtime_dependency():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    needed = {  # on the lent machine's Python 3.12 (typing_extensions is only below 3.11's)
        canonical(need.name)
        for need in map(Requirement, project["dependencies"])
        if need.marker is None or need.marker.evaluate({"python_version": "3.12"})
    }
    lists = wheelhouse_lists()
    assert lists["PREINSTALLED"] == PREINSTALLED
    assert needed - PREINSTALLED <= lists["RUNTIME"], "add them to RUNTIME"
    wheels = set().union(*(lists[name] for name in ("RUNTIME", "MATPLOTLIB_DEPS", "TEST_DEPS")))
    assert not wheels & PREINSTALLED  # a second torch would not fit in what a device run carries


def gpu_trace(kernel: str) -> dict:
    """A profile's trace as torch.profiler writes it on a GPU: a step, a launch, its kernel."""
    host = {"ph": "X", "pid": 1, "tid": 1}
    return {
        "traceEvents": [
            {**host, "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 1000},
            {**host, "cat": "cpu_op", "name": "aten::cudnn_batch_norm", "ts": 0, "dur": 20},
            {
                **host,
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "ts": 5,
                "dur": 2,
                "args": {"correlation": 1},
            },
            {
                "ph": "X",
                "cat": "kernel",
                "name": kernel,
                "pid": 0,
                "tid": 7,
                "ts": 10,
                "dur": 900,
                "args": {"device": 0, "correlation": 1},
            },
        ]
    }


def test_the_table_names_every_part_and_what_it_lacks(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    figures = {"end_to_end": 2500.0, "compute": 3000.0}
    results = {"figures": figures, "peaks": {"compute": "20.10 GiB"}, "data": "1024 JPEGs"}
    (parts / "bf16.json").write_text(json.dumps(results))
    example = {"baseline": 1000.0, "without_ddp": 1200.0, "with_ddp": 1000.0}
    (parts / "example.json").write_text(json.dumps({"figures": example}))
    (parts / "fp16_compile.failed").write_text("failed or ran past 150s (see gpu_check.log)\n")
    (parts / "cpu_decode.json").write_text(json.dumps({"figures": {"end_to_end": 900.0}}))
    (parts / "cpu_decode.failed").write_text("failed or ran past 90s (see gpu_check.log)\n")
    (parts / "pytest.txt").write_text("3 passed, 700 deselected in 30.00s\n")
    (parts / "profiles").mkdir()
    for part, kernel in (("bf16", "bn_fw<c10::BFloat16>"), ("fp16", "bn_fw<__half>")):
        with gzip.open(parts / "profiles" / f"{part}_compute.trace.json.gz", "wt") as trace:
            json.dump(gpu_trace(kernel), trace)
        (parts / "profiles" / f"{part}_compute.profile.md").write_text(f"# Profile of {part}\n")
    out = tmp_path / "gpu_check.md"
    subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gpu_check_table.py"), str(parts), str(out)],
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},  # as gpu_check.sh runs it: benchmarks/
    )
    table = out.read_text()
    assert f"torch {torch.__version__}" in table and "1024 JPEGs" in table
    assert "`pytest -m gpu`: 3 passed, 700 deselected in 30.00s." in table
    assert "| compute only (`--train_data null`), bfloat16, channels_last | 3000 | 20.10 GiB |" in (
        table
    )
    assert "| compute only, float16, `--compile` | not measured: failed or ran past 150s" in table
    assert "| compute only, float16 (grad scaler), channels_last | skipped |  |" in table
    # A figure measured before its part was cut short is kept.
    assert "| end to end from LMDB, CPU decode on 3/4 of the cores, bfloat16 | 900 |  |" in table
    assert "ours end to end / the ImageNet example: 2.50x" in table
    assert "DDP's cost at one process: 16.7%" in table
    # The profiles side by side: what each says, and each kind of kernel by precision.
    assert "| bf16_compute | 1 step, 1.0 ms a step: the GPU was busy 90% of the time" in table
    assert "| kind | backend | precision | bf16_compute | fp16_compute |" in table
    assert "| batch norm | cuDNN | bfloat16 | 0.90 |  |" in table
    assert "| batch norm | cuDNN | float16 |  | 0.90 |" in table
    assert "#### Profile of bf16" in table and "#### Profile of fp16" in table
    # The same figures as benchmarks/' records, for `python -m benchmarks tables`.
    records = {
        record["name"]: record
        for record in json.loads(out.with_suffix(".json").read_text())["figures"]
    }
    assert records["gpu_compute_bf16_images_s"]["value"] == 3000.0
    assert records["gpu_compute_bf16_images_s"]["goal"] == 3000.0
    assert records["gpu_vs_example_loop"]["value"] == 2.5
    assert records["gpu_end_to_end_cpu_decode_images_s"]["value"] == 900.0
    assert "gpu_compute_fp16_images_s" not in records  # skipped: no figure, no record
