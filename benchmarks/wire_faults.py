"""Faults on the wire: how long two machines take to notice a lost link, measured on network
namespaces (benchmarks/network_namespaces.py; needs root).

Two machines (m0, m1), each a `resnet50-trainer` shard of 2 CPU processes (ResNet-18 at 32 px,
synthetic data), meet through a shared directory or through Redis on a third machine; then:
  mid_epoch  m1's link goes down once shard 0 finished step 2 (--timeout holds from there);
  store      the same for m0, whose shard 0 serves the run's store;
  meeting    m1's link goes down once the shards met, before their processes form the group
             (--first_iter_timeout holds);
  redis      Redis's link goes down once the shards met; the run must train to its end (its
             seconds are the rest of the run, not a time to notice).
For each, the seconds from the fault to each machine's exit, its exit status and its error lines.
Prints a Markdown table (also written to --out). Usage: sudo python -m benchmarks.wire_faults
Its figures (one run of each fault, as root): python -m benchmarks run --only wire_faults
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from benchmarks.network_namespaces import NamespaceNetwork, namespaces_unavailable
from benchmarks.registry import LOWER, Context, Figure, benchmark
from benchmarks.trees import BENCHMARKS_ROOT, MeasurementFailed, Tree

SMALL_RUN = ["--use_cpu", "--num_layers", "18", "--image_size", "32", "--batch_size", "8"]
SMALL_RUN += ["--num_labels", "4", "--num_workers", "0", "--num_gpus", "2", "--num_shards", "2"]
# fault -> the line of shard 0's that triggers it, the machine whose link goes down
FAULTS = {
    "mid_epoch": ("Finished iteration 2/", "m1"),
    "store": ("Finished iteration 2/", "m0"),
    "meeting": ("All 2 shards", "m1"),
    "redis": ("All 2 shards", "redis"),
}
RUN_LIMIT_S = 300
TIMEOUT_S, FIRST_ITER_TIMEOUT_S = 10, 20  # the runs' --timeout and --first_iter_timeout


@dataclass
class Machine:
    """One shard's command, its output lines as they come (seconds since start, line)."""

    process: subprocess.Popen
    lines: list[tuple[float, str]] = field(default_factory=list)
    ended: float = 0.0  # when its output closed: the shard and all its processes are gone

    def __post_init__(self) -> None:
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))
        self.ended = time.monotonic()

    def wait_for(self, text: str) -> None:
        deadline = time.monotonic() + RUN_LIMIT_S
        while not any(text in line for _, line in self.lines):
            if time.monotonic() > deadline or not self.pump.is_alive():
                raise RuntimeError(f"never printed {text!r}: {self.lines[-5:]}")
            time.sleep(0.05)

    def finish(self) -> None:
        self.process.wait(RUN_LIMIT_S)
        self.pump.join()

    def errors(self) -> list[str]:
        return [line for _, line in self.lines if "error:" in line]


def start_machine(
    net: NamespaceNetwork, name: str, flags: list[str], out: str, tree: Tree
) -> Machine:
    log_dir = os.path.join(out, name)
    os.makedirs(log_dir)
    flags = [*SMALL_RUN, "--shard_id", name[1:], *flags]
    flags += ["--distributed_interfaces", net.interface(name), "--log_dir", log_dir]
    process = subprocess.Popen(
        net.command(name, tree.trainer(flags)),
        env=tree.environment(),
        cwd=log_dir,  # not a checkout: only PYTHONPATH finds the trainer
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return Machine(process)


@contextmanager
def redis_on(net: NamespaceNetwork, port: int = 6379) -> Iterator[list[str]]:
    """redis-server on the "redis" machine; yields the trainer's flags to meet there."""
    address = net.address("redis")
    server = subprocess.Popen(
        net.command(
            "redis",
            ["redis-server", "--port", str(port), "--bind", address, "--save", ""]
            + ["--appendonly", "no", "--protected-mode", "no"],
        ),
        stdout=subprocess.DEVNULL,
    )
    try:
        time.sleep(0.5)  # redis-server answers within milliseconds; the meeting retries anyway
        yield ["--redis_host", address, "--redis_port", str(port)]
    finally:
        server.terminate()
        server.wait()


def one_run(fault: str, settings: argparse.Namespace, repeat: int, tree: Tree) -> dict:
    """Both machines through `fault`: seconds to each one's exit, statuses, error lines."""
    out = tempfile.mkdtemp(prefix="wire_faults_")
    meeting_dir = os.path.join(out, "nfs")
    os.makedirs(meeting_dir)
    flags = ["--train_data", "null", "--run_id", f"{fault}{repeat}", "--print_every", "2"]
    flags += ["--timeout", str(settings.timeout)]
    flags += ["--first_iter_timeout", str(settings.first_iter_timeout)]
    trigger, victim = FAULTS[fault]
    flags += ["--epoch_size", "64" if trigger == "All 2 shards" else "100000", "--num_epochs", "1"]
    try:
        with NamespaceNetwork(("m0", "m1", "redis")) as net, redis_on(net) as through_redis:
            meet = through_redis if fault == "redis" else ["--file_store_path", meeting_dir]
            machines = [start_machine(net, name, flags + meet, out, tree) for name in ("m1", "m0")]
            shard_0 = machines[1]
            shard_0.wait_for(trigger)
            net.link_down(victim)
            fault_at = time.monotonic()
            for machine in machines:
                machine.finish()
            return {
                "seconds": [round(machine.ended - fault_at, 1) for machine in machines[::-1]],
                "statuses": [machine.process.returncode for machine in machines[::-1]],
                "errors": [machine.errors() for machine in machines[::-1]],
            }
    finally:
        shutil.rmtree(out, ignore_errors=True)


# fault -> the flag whose seconds bound the machines' wait (none: the run goes on)
BOUND_BY = {"mid_epoch": "timeout", "store": "timeout", "meeting": "first_iter_timeout"}


def bound_s(fault: str, settings: argparse.Namespace) -> int:
    return getattr(settings, BOUND_BY[fault]) if fault in BOUND_BY else 0


def table(results: dict[str, list[dict]], settings: argparse.Namespace) -> str:
    """One row a fault: seconds from the fault to each machine's exit (median, min-max), exit
    statuses and error lines a machine; then each machine's line, from the first repeat."""
    rows = [
        "| fault | bound | shard 0 (m0) s to exit | shard 1 (m1) s to exit | exit statuses "
        "| error lines a machine |",
        "|---|---|---|---|---|---|",
    ]
    examples: list[str] = []
    for fault, runs in results.items():
        spans = []
        for machine in (0, 1):
            seconds = [run["seconds"][machine] for run in runs]
            spans.append(
                f"{statistics.median(seconds):.1f} ({min(seconds):.1f}-{max(seconds):.1f})"
            )
        statuses = sorted({tuple(run["statuses"]) for run in runs})
        lines = sorted({len(errors) for run in runs for errors in run["errors"]})
        flag = BOUND_BY.get(fault)
        bound = f"--{flag} {bound_s(fault, settings)}" if flag else "(none: the run goes on)"
        rows.append(
            f"| {fault} | {bound} | {spans[0]} | {spans[1]} | "
            f"{', '.join(map(str, statuses))} | {', '.join(map(str, lines))} |"
        )
        for machine, errors in enumerate(runs[0]["errors"]):
            examples.extend(f"- {fault}, shard {machine}: `{line}`" for line in errors)
    return "\n".join([*rows, "", *examples])


def unavailable() -> str | None:
    if shutil.which("redis-server") is None:
        return "needs redis-server"
    return namespaces_unavailable()


def fault_figures(tree: Tree, settings: argparse.Namespace) -> dict[str, float]:
    """One run of each fault: the seconds from it to the last machine's exit beyond the flag
    that bounds their wait; the Redis fault's run must go on to its end (exit 0 both)."""
    figures = {}
    for fault in FAULTS:
        run = one_run(fault, settings, 0, tree)
        if fault not in BOUND_BY and run["statuses"] != [0, 0]:
            raise MeasurementFailed(f"{fault}: the run ended with {run['statuses']}: {run}")
        beyond = max(run["seconds"]) - bound_s(fault, settings)
        figures[f"wire_{fault}_beyond_bound_s"] = beyond
    return figures


@benchmark(
    "wire_faults",
    "Faults on the wire, two machines of network namespaces",
    tuple(
        Figure(
            f"wire_{fault}_beyond_bound_s",
            "s",
            LOWER,
            None,
            0.2,
            f"{what}: seconds from the link's loss to the last machine's exit, less {bound}",
            floor=2.0,
        )
        for fault, what, bound in (
            ("mid_epoch", "shard 1's link down mid-epoch", f"--timeout {TIMEOUT_S}"),
            ("store", "shard 0's (the store's) link down mid-epoch", f"--timeout {TIMEOUT_S}"),
            (
                "meeting",
                "shard 1's link down after the meeting",
                f"--first_iter_timeout {FIRST_ITER_TIMEOUT_S}",
            ),
            ("redis", "Redis's link down after the meeting (the run goes on)", "nothing"),
        )
    ),
    unavailable=unavailable,
    rounds=(1, 3),
    order=75,
)
def measure_wire_faults(context: Context, tree: Tree) -> dict[str, float]:
    settings = argparse.Namespace(timeout=TIMEOUT_S, first_iter_timeout=FIRST_ITER_TIMEOUT_S)
    return fault_figures(tree, settings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=TIMEOUT_S)
    parser.add_argument("--first_iter_timeout", type=int, default=FIRST_ITER_TIMEOUT_S)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--out", default="wire_faults.md")
    settings = parser.parse_args()
    reason = unavailable()
    this = Tree("this", BENCHMARKS_ROOT)
    if reason is not None:
        sys.exit(f"benchmarks.wire_faults: {reason}")
    results = {
        fault: [one_run(fault, settings, repeat, this) for repeat in range(settings.repeats)]
        for fault in settings.faults.split(",")
    }
    report = table(results, settings)
    print(report)
    with open(settings.out, "w") as file:
        file.write(report + "\n")


if __name__ == "__main__":
    main()
