"""What a libjpeg-turbo decode costs by how its rows are asked for, and in its fast modes
(benchmarks/libjpeg_rows.c, built here with the C compiler against the system's libjpeg): one row a
call and 16-row blocks with the fast IDCT and merged upsampling, each over 16-row blocks copied out
(what data/formats/_jpeg_region.c asks for), on the photographs' files. The same program for every
tree: it measures libjpeg, not the trainer. Run: python -m benchmarks run --only libjpeg_rows"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
from pathlib import Path

from benchmarks.input_pipeline import photo_sets, prepare_photo_sets
from benchmarks.registry import LOWER, Context, Figure, benchmark
from benchmarks.trees import BENCHMARKS_ROOT, MeasurementFailed, Tree

SOURCE = BENCHMARKS_ROOT / "benchmarks" / "libjpeg_rows.c"
FILES = 300  # the program's command line holds each file's path
# The program's ways, as it names them in its lines ("NAME: 123 us; ...").
ONE_ROW, BLOCKS = "one row a call", "16-row blocks"
FAST = "16-row blocks, fast IDCT + merged upsampling"


def _no_compiler() -> str | None:
    return None if shutil.which("cc") else "no C compiler (cc) to build libjpeg_rows.c"


def microseconds_by_way(output: str) -> dict[str, float]:
    """Each way's median over the program's rounds (a line each), microseconds a decode."""
    rounds: dict[str, list[float]] = {}
    for name, us in re.findall(r"([^:;]+): (\d+) us", output):
        rounds.setdefault(name.strip(), []).append(float(us))
    return {name: statistics.median(values) for name, values in rounds.items()}


@benchmark(
    "libjpeg_rows",
    "libjpeg-turbo's rows and fast modes, one core",
    (
        Figure(
            "libjpeg_one_row_vs_blocks",
            "x",
            LOWER,
            None,
            0.1,
            "a whole-frame decode asked for one row a call over one asked for 16-row blocks",
        ),
        Figure(
            "libjpeg_fast_vs_blocks",
            "x",
            LOWER,
            None,
            0.1,
            "16-row blocks with the fast IDCT and merged upsampling over the accurate modes",
        ),
    ),
    prepare=prepare_photo_sets,
    unavailable=_no_compiler,
    order=28,
)
def measure_libjpeg_rows(context: Context, tree: Tree) -> dict[str, float]:
    program = context.scratch / "libjpeg_rows"
    built = subprocess.run(
        ["cc", "-O2", "-o", str(program), str(SOURCE), "-ljpeg"], capture_output=True, text=True
    )
    if built.returncode:
        raise MeasurementFailed(f"libjpeg_rows.c could not be built:\n{built.stderr[-2000:]}")
    files = sorted(str(path) for path in Path(photo_sets(context)["files"]).rglob("*.jpg"))
    ran = subprocess.run([str(program), *files[:FILES]], capture_output=True, text=True)
    if ran.returncode:
        raise MeasurementFailed(f"libjpeg_rows failed ({ran.returncode}):\n{ran.stderr[-2000:]}")
    ways = microseconds_by_way(ran.stdout)
    return {
        "libjpeg_one_row_vs_blocks": ways[ONE_ROW] / ways[BLOCKS],
        "libjpeg_fast_vs_blocks": ways[FAST] / ways[BLOCKS],
    }
