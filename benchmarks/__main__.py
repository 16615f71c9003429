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
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks import tables
from benchmarks.errors import BenchmarkUsageError
from benchmarks.output import output_path, replace_file
from benchmarks.registry import Benchmark, Figure, registered
from benchmarks.runner import Samples, Session, compared, measure, records, select
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
        command.add_argument("--json", help="also write the figures here")
        command.add_argument(
            "--data", default=str(DEFAULT_DATA), help="generated inputs, kept between runs"
        )
        if name == "compare":
            command.add_argument("--base", required=True, help="a checkout to compare with")
    table = commands.add_parser("tables", help="write BENCHMARKS.md from run's JSON files")
    table.add_argument("results", type=Path, nargs="+")
    table.add_argument("--out", type=Path, default=BENCHMARKS_ROOT / "BENCHMARKS.md")
    commands.add_parser("list", help="every figure: unit, goal, noise band, quick or not")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # A scheduler's or a shell's stop ends the run as Ctrl-C does: measuring processes and their
    # children stopped, temporary folders removed, nothing written.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        if args.command == "tables":
            tables.write(args.results, args.out)
            print(f"wrote {args.out} and {tables.SPEED_DOC}")
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


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def folder(path: str, flag: str) -> Path:
    """A folder flag's value; an empty one is refused (it would mean the working directory)."""
    if not path:
        raise BenchmarkUsageError(f"{flag} is empty: name a folder")
    return Path(path).resolve()


def run_or_compare(args: argparse.Namespace) -> int:
    this = Tree("this", BENCHMARKS_ROOT)
    trees = [this]
    if args.command == "compare":
        base = Tree("base", folder(args.base, "--base"))
        problem = base.problem()
        if problem:
            raise BenchmarkUsageError(f"--base {problem}")
        trees.append(base)
    chosen = select(args.only, args.quick)
    json_path = output_path(args.json, "--json") if args.json is not None else None
    data = folder(args.data, "--data")
    try:
        data.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise BenchmarkUsageError(
            f"--data {data}: {error.strerror}: name a writable folder"
        ) from None
    for tree in trees:
        if tree.missing_extensions():
            print(f"building {tree.name}'s C modules in {tree.path}", flush=True)
        tree.build()
    with tempfile.TemporaryDirectory(prefix="benchmarks_") as scratch:
        session = Session(data, Path(scratch), args.quick)
        samples, failures = measure(chosen, trees, session, lambda line: print(line, flush=True))
    figures = {tree.name: records(chosen, samples[tree.name], tree) for tree in trees}
    print()
    print(tables.run_table(figures["this"]))
    if failures:
        print(
            "\n" + "\n".join(f"{where}: {why.splitlines()[0]}" for where, why in failures.items())
        )
    if json_path is not None:
        # `tables` reads "figures" (this tree's); a comparison keeps the base's beside them.
        payload = {
            "figures": figures["this"],
            **({"base": figures["base"]} if len(trees) > 1 else {}),
        }
        replace_file(json_path, json.dumps(payload, indent=1) + "\n", "--json")
    if args.command == "run":
        return 1 if any(not why.startswith("skipped") for why in failures.values()) else 0
    return verdict(chosen, samples, failures, this.commit(), trees[1].commit())


def verdict(
    chosen: dict[Benchmark, list[Figure]],
    samples: dict[str, Samples],
    failures: dict[str, str],
    this_commit: str,
    base_commit: str,
) -> int:
    """compare's table and exit status: 1 where a figure of this tree is worse beyond its band,
    failed here, or could not be compared (the base failed to measure it), else 0."""
    rows = compared(chosen, samples["this"], samples["base"])
    print()
    print(tables.compare_table(rows, this_commit, base_commit))
    worse = [figure.name for figure, _, _, verdict in rows if verdict == "worse"]
    failed_here = [where for where in failures if where.endswith(" in this")]
    judged = {figure.name for figure, _, _, _ in rows}
    unjudged = [
        figure.name
        for bench, figures in chosen.items()
        for figure in figures
        if figure.name not in judged
        and f"{bench.name} in this" not in failures
        and not failures.get(bench.name, "").startswith("skipped")
    ]
    if unjudged:
        print(f"\nnot compared (the base did not measure them): {', '.join(unjudged)}")
    if worse or failed_here:
        print(f"\nworse than --base beyond the noise band: {', '.join(worse + failed_here)}")
    if worse or failed_here or unjudged:
        return 1
    print("\nno figure worse than --base beyond its noise band")
    return 0


if __name__ == "__main__":
    sys.exit(main())
