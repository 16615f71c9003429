"""python -m benchmarks run|compare|tables|list (docs/speed.md, "Benchmarks").

  run [--quick] [--only NAME ...] [--json FILE]      this tree's figures: a table, and JSON
  compare --base DIR [--quick] [--only NAME ...]      this tree against the checkout at DIR, in
                                                      one interleaved run; exit 1 if a figure got
                                                      worse beyond its noise band
  tables FILE.json ... [--out BENCHMARKS.md]          BENCHMARKS.md's tables from run's JSON
  list                                                every figure, its unit, goal and band
Bad input: one line, exit 2."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks import tables
from benchmarks.registry import registered
from benchmarks.runner import BenchmarkUsageError, Session, compared, measure, records, select
from benchmarks.trees import BENCHMARKS_ROOT, Tree

DEFAULT_DATA = Path(tempfile.gettempdir()) / "resnet50_bench_data"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    commands = top.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("run", "measure this tree's figures"),
        ("compare", "measure this tree and --base in one run, interleaved"),
    ):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("--quick", action="store_true", help="the quick set (<= 5 minutes)")
        command.add_argument(
            "--only", nargs="+", default=[], metavar="NAME", help="figures or benchmarks"
        )
        command.add_argument("--json", type=Path, help="also write the figures here")
        command.add_argument(
            "--data", type=Path, default=DEFAULT_DATA, help="generated inputs, kept between runs"
        )
        if name == "compare":
            command.add_argument(
                "--base", type=Path, required=True, help="a checkout to compare with"
            )
    table = commands.add_parser("tables", help="write BENCHMARKS.md from run's JSON files")
    table.add_argument("results", type=Path, nargs="+")
    table.add_argument("--out", type=Path, default=BENCHMARKS_ROOT / "BENCHMARKS.md")
    commands.add_parser("list", help="every figure: unit, goal, noise band, quick or not")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "tables":
            tables.write(args.results, writable(args.out, "--out"))
            print(f"wrote {args.out}")
            return 0
        if args.command == "list":
            print(tables.figure_list(registered()))
            return 0
        return run_or_compare(args)
    except BenchmarkUsageError as error:
        print(f"benchmarks: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("benchmarks: interrupted; nothing written", file=sys.stderr)
        return 130


def writable(path: Path, what: str) -> Path:
    """`path`, once its folder is known to take a file (checked before minutes of measuring)."""
    folder = path.resolve().parent
    if path.is_dir() or not folder.is_dir() or not os.access(folder, os.W_OK):
        raise BenchmarkUsageError(
            f"{what} {path} cannot be written: name a file in a writable folder"
        )
    return path


def write_json(path: Path, payload: object) -> None:
    """Written beside `path` and renamed over it: a stopped run leaves no half file."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(payload, indent=1) + "\n")
    partial.replace(path)


def run_or_compare(args: argparse.Namespace) -> int:
    this = Tree("this", BENCHMARKS_ROOT)
    trees = [this]
    if args.command == "compare":
        base = Tree("base", args.base.resolve())
        problem = base.problem()
        if problem:
            raise BenchmarkUsageError(f"--base {problem}")
        trees.append(base)
    chosen = select(args.only, args.quick)
    if args.json:
        writable(args.json, "--json")
    try:
        args.data.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise BenchmarkUsageError(
            f"--data {args.data}: {error.strerror}: name a writable folder"
        ) from None
    for tree in trees:
        if tree.missing_extensions():
            print(f"building {tree.name}'s C modules in {tree.path}", flush=True)
        tree.build()
    with tempfile.TemporaryDirectory(prefix="benchmarks_") as scratch:
        session = Session(args.data.resolve(), Path(scratch), args.quick)
        samples, failures = measure(chosen, trees, session, lambda line: print(line, flush=True))
    figures = {tree.name: records(chosen, samples[tree.name], tree) for tree in trees}
    if args.json:
        payload = figures["this"] if len(trees) == 1 else figures
        write_json(args.json, {"figures": payload})
    print()
    print(tables.run_table(figures["this"]))
    if failures:
        print(
            "\n" + "\n".join(f"{where}: {why.splitlines()[0]}" for where, why in failures.items())
        )
    if args.command == "run":
        return 1 if any(not why.startswith("skipped") for why in failures.values()) else 0
    rows = compared(chosen, samples["this"], samples["base"])
    print()
    print(tables.compare_table(rows, this.commit(), trees[1].commit()))
    worse = [figure.name for figure, _, _, verdict in rows if verdict == "worse"]
    failed_here = [where for where in failures if where.endswith(" in this")]
    if worse or failed_here:
        print(f"\nworse than --base beyond the noise band: {', '.join(worse + failed_here)}")
        return 1
    print("\nno figure worse than --base beyond its noise band")
    return 0


if __name__ == "__main__":
    sys.exit(main())
