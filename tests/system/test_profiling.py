"""--profile_iters writes a gzipped Chrome trace and its analysis next to the log, says in one line
where the steps' time went, and the run goes on to the end."""

from __future__ import annotations

import glob
import gzip
import json

from tests.support.trainer_runs import read_log, run_trainer


def test_profile_iters_writes_a_trace_that_loads_as_json(tmp_path):
    result = run_trainer(
        *("--train_data", "null", "--batch_size", "2", "--epoch_size", "16", "--num_labels", "10"),
        *("--num_epochs", "1", "--profile_iters", "2", "--log_dir", str(tmp_path)),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    log_path, _, rows = read_log(tmp_path)
    assert int(rows[0]["cumulative_batch_count"]) == 8  # all steps ran, profiled or not
    (trace,) = glob.glob(str(tmp_path / "*.trace.json.gz"))
    assert trace == log_path[: -len(".log")] + ".trace.json.gz"
    with gzip.open(trace, "rt") as file:
        events = json.load(file)["traceEvents"]
    assert any("conv" in event.get("name", "") for event in events)
    steps = [event for event in events if event.get("name", "").startswith("ProfilerStep#")]
    assert len(steps) == 2
    table = log_path[: -len(".log")] + ".profile.md"
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("Profile of")]
    assert line.startswith("Profile of 2 steps, ") and " ms a step on the CPU: " in line
    assert line.endswith(f"; table {table}, trace {trace}")
    with open(table) as file:
        text = file.read()
    assert "| forward, backward and the loop |" in text and "aten::convolution" in text
