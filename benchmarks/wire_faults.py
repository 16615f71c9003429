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

REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def start_machine(net: NamespaceNetwork, name: str, flags: list[str], out: str) -> Machine:
    log_dir = os.path.join(out, name)
    os.makedirs(log_dir)
    command = [sys.executable, "-m", "resnet50_trainer", *SMALL_RUN, "--shard_id", name[1:]]
    command += ["--distributed_interfaces", net.interface(name), "--log_dir", log_dir, *flags]
    process = subprocess.Popen(
        net.command(name, command),
        env={**os.environ, "PYTHONPATH": REPOSITORY},
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


def one_run(fault: str, settings: argparse.Namespace, repeat: int) -> dict:
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
            machines = [start_machine(net, name, flags + meet, out) for name in ("m1", "m0")]
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


BOUNDS = {
    "mid_epoch": "--timeout {timeout}",
    "store": "--timeout {timeout}",
    "meeting": "--first_iter_timeout {first_iter_timeout}",
    "redis": "(none: the run goes on)",
}


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
        bound = BOUNDS[fault].format(**vars(settings))
        rows.append(
            f"| {fault} | {bound} | {spans[0]} | {spans[1]} | "
            f"{', '.join(map(str, statuses))} | {', '.join(map(str, lines))} |"
        )
        for machine, errors in enumerate(runs[0]["errors"]):
            examples.extend(f"- {fault}, shard {machine}: `{line}`" for line in errors)
    return "\n".join([*rows, "", *examples])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=10)
    parser.add_argument("--first_iter_timeout", type=int, default=20)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--out", default="wire_faults.md")
    settings = parser.parse_args()
    reason = namespaces_unavailable()
    if reason is not None:
        sys.exit(f"benchmarks.wire_faults: {reason}")
    results = {
        fault: [one_run(fault, settings, repeat) for repeat in range(settings.repeats)]
        for fault in settings.faults.split(",")
    }
    report = table(results, settings)
    print(report)
    with open(settings.out, "w") as file:
        file.write(report + "\n")


if __name__ == "__main__":
    main()
