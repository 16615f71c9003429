"""scripts/gpu_check.sh's one markdown file, from what its parts left in a folder: the figures'
table, the profiles side by side (the GPU's busy share, its idle time by cause, each kind of
kernel's time by precision: read from the traces), then each profile's own table; and the same
figures as benchmarks/' records (OUT.json beside OUT.md: what `python -m benchmarks run --json`
writes, under the names benchmarks/train.py declares, for `python -m benchmarks tables`).

usage: PYTHONPATH=. python scripts/gpu_check_table.py PARTS_DIR OUT.md (gpu_check.sh runs it so)
PARTS_DIR holds NAME.json ({"figures": {...}, "peaks": {...}, "profiles": {...}, "data": "..."},
as benchmarks/train.py --results writes them), NAME.failed (one line: why a part has no
figures), pytest.txt (pytest -m gpu's summary line) and profiles/ (PART_WHAT.profile.md and
.trace.json.gz, as benchmarks/train.py --profile_dir keeps them)."""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
from pathlib import Path

import torch

from resnet50_trainer.reporting.profiling import TABLE_SUFFIX, TRACE_SUFFIX
from resnet50_trainer.reporting.trace_report import TraceReport, read_trace

# (part, figure, its name in benchmarks/ or "", what it is): the rows, in order.
ROWS = [
    (
        "bf16",
        "compute",
        "gpu_compute_bf16_images_s",
        "compute only (`--train_data null`), bfloat16, channels_last",
    ),
    (
        "fp16",
        "compute",
        "gpu_compute_fp16_images_s",
        "compute only, float16 (grad scaler), channels_last",
    ),
    (
        "bf16_compile",
        "compute",
        "gpu_compute_bf16_compile_images_s",
        "compute only, bfloat16, `--compile`",
    ),
    (
        "fp16_compile",
        "compute",
        "gpu_compute_fp16_compile_images_s",
        "compute only, float16, `--compile`",
    ),
    (
        "bf16",
        "end_to_end",
        "gpu_end_to_end_images_s",
        "end to end from LMDB, `--decode_device gpu`, bfloat16",
    ),
    (
        "cpu_decode",
        "end_to_end",
        "gpu_end_to_end_cpu_decode_images_s",
        "end to end from LMDB, CPU decode on 3/4 of the cores, bfloat16",
    ),
    (
        "cpu_decode_all",
        "end_to_end",
        "",
        "end to end from LMDB, CPU decode on every core, bfloat16",
    ),
    (
        "input_gpu",
        "input",
        "gpu_input_nvjpeg_images_s",
        "input only (`resnet50-db bench`), nvJPEG decode",
    ),
    (
        "input_cpu",
        "input",
        "gpu_input_cpu_decode_images_s",
        "input only (`resnet50-db bench`), CPU decode on every core",
    ),
    (
        "example",
        "baseline",
        "gpu_example_loop_images_s",
        "baseline: PyTorch's ImageNet example loop, float32, ImageFolder",
    ),
    ("example", "without_ddp", "", "one process, plain module (what the trainer runs), float32"),
    ("example", "with_ddp", "", "one process, DistributedDataParallel around it, float32"),
]
# Declared ratios: (name, numerator's name, denominator's name).
RATIOS = [
    ("gpu_end_to_end_vs_compute", "gpu_end_to_end_images_s", "gpu_compute_bf16_images_s"),
    ("gpu_vs_example_loop", "gpu_end_to_end_images_s", "gpu_example_loop_images_s"),
]


def load(parts: Path) -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in sorted(parts.glob("*.json"))}


def cells(
    results: dict[str, dict], failures: dict[str, str], part: str, figure: str
) -> tuple[str, str]:
    """(images/s, peak GPU memory) of a row."""
    found = results.get(part, {})
    if figure in found.get("figures", {}):  # measured before its part failed, too
        return f"{found['figures'][figure]:.0f}", found.get("peaks", {}).get(figure, "")
    if part in failures:
        return f"not measured: {failures[part]}", ""
    return "skipped", ""


def ratios(results: dict[str, dict]) -> list[str]:
    figures = {
        **results.get("example", {}).get("figures", {}),
        **results.get("bf16", {}).get("figures", {}),
    }
    lines = []
    if {"end_to_end", "baseline"} <= figures.keys():
        lines.append(
            f"- ours end to end / the ImageNet example: "
            f"{figures['end_to_end'] / figures['baseline']:.2f}x"
        )
    if {"end_to_end", "compute"} <= figures.keys():
        lines.append(
            f"- end to end / compute only (bfloat16): "
            f"{figures['end_to_end'] / figures['compute']:.0%}"
        )
    if {"with_ddp", "without_ddp"} <= figures.keys():
        lines.append(
            f"- DDP's cost at one process: {1 - figures['with_ddp'] / figures['without_ddp']:.1%}"
            " (the trainer runs without it at one process)"
        )
    return lines


def table(parts: Path) -> str:
    results = load(parts)
    failures = {path.stem: path.read_text().strip() for path in parts.glob("*.failed")}
    pytest_file = parts / "pytest.txt"
    tests = pytest_file.read_text().strip() if pytest_file.exists() else "not run"
    data = next((found["data"] for found in results.values() if "data" in found), "")
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA GPU"
    lines = [
        f"### GPU check: {device}, {datetime.date.today()}, torch {torch.__version__} "
        f"(CUDA {torch.version.cuda}), {os.cpu_count()} cores",
        "",
        f"ResNet-50, 224 px, batch 256; data: {data or 'none built'}. `pytest -m gpu`: {tests}.",
        "",
        "| what | images/s | peak GPU memory |",
        "| --- | ---: | ---: |",
    ]
    for part, figure, _, what in ROWS:
        rate, peak = cells(results, failures, part, figure)
        lines.append(f"| {what} | {rate} | {peak} |")
    return "\n".join([*lines, "", *ratios(results), *profiles(parts / "profiles")]) + "\n"


def profiles(folder: Path) -> list[str]:
    """The profiles side by side, read from their traces, then each one's own table."""
    traces = sorted(folder.glob(f"*{TRACE_SUFFIX}"))
    if not traces:
        return []
    reports: dict[str, TraceReport] = {}
    for trace in traces:
        with gzip.open(trace, "rt") as file:
            reports[trace.name.removesuffix(TRACE_SUFFIX)] = read_trace(json.load(file))
    lines = [
        "",
        "#### Where the time went: a profile of each run's steps before its timed window",
        "",
        "| profile | what it says |",
        "| --- | --- |",
        *(f"| {name} | {report.line()} |" for name, report in reports.items()),
        "",
        "Kernel time, ms a step, by what launched the kernels, their backend and the precision",
        "their names carry:",
        "",
        "| kind | backend | precision | " + " | ".join(reports) + " |",
        "| --- | --- | --- |" + " ---: |" * len(reports),
    ]
    kinds = sorted(
        {
            (group.kind, group.backend, group.precision)
            for r in reports.values()
            for group in r.kernels
        }
    )
    for kind in kinds:
        times = [
            next(
                (
                    f"{g.time / 1e3 / r.steps:.2f}"
                    for g in r.kernels
                    if (g.kind, g.backend, g.precision) == kind
                ),
                "",
            )
            for r in reports.values()
        ]
        lines.append("| " + " | ".join([*kind, *times]) + " |")
    for table in sorted(folder.glob(f"*{TABLE_SUFFIX}")):
        own = table.read_text().replace("# Profile of", "#### Profile of", 1)
        lines += ["", f"<!-- {table.name} -->", own.rstrip()]
    return lines


def figure_records(parts: Path) -> list[dict[str, object]]:
    """The parts' figures as benchmarks/' records, under their declared names."""
    from benchmarks.registry import registered
    from benchmarks.runner import records
    from benchmarks.trees import BENCHMARKS_ROOT, Tree

    results = load(parts)
    values = {
        name: [results[part]["figures"][figure]]
        for part, figure, name, _ in ROWS
        if name and figure in results.get(part, {}).get("figures", {})
    }
    for name, numerator, denominator in RATIOS:
        if numerator in values and denominator in values:
            values[name] = [values[numerator][0] / values[denominator][0]]
    gpu = registered()["gpu"]
    return records({gpu: list(gpu.figures)}, values, Tree("this", BENCHMARKS_ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parts_dir", type=Path, help="the folder gpu_check.sh's parts wrote into")
    parser.add_argument("out", type=Path, help="the markdown file to write")
    args = parser.parse_args()
    if not args.parts_dir.is_dir():
        parser.error(f"{args.parts_dir} is not a folder")
    args.out.write_text(table(args.parts_dir))
    figures = args.out.with_suffix(".json")
    figures.write_text(json.dumps({"figures": figure_records(args.parts_dir)}, indent=1) + "\n")
    print(args.out.read_text(), end="")
    print(f"figures for `python -m benchmarks tables`: {figures}")


if __name__ == "__main__":
    main()
