"""The CSV run log: the original's file name, first line and header."""

from __future__ import annotations

import re
import time
from pathlib import Path

from resnet50_trainer.reporting.runlog import HEADER, EpochRow, RunLog, log_file_name
from tests.support.trainer_runs import config_of

ORIGINAL_HEADER = (
    "time_spent,cumulative_time_spent,input_count,cumulative_input_count,"
    "cumulative_batch_count,inputs_per_sec,accuracy,epoch,learning_rate,loss,test_accuracy"
)


def config(tmp_path, *extra):
    return config_of(
        *("--train_data", "null", "--use_cpu", "--num_gpus", "2", "--batch_size", "64"),
        *("--log_dir", str(tmp_path), *extra),
    )


def test_file_name_follows_the_original(tmp_path):
    started = time.mktime((2026, 11, 21, 10, 15, 30, 0, 0, -1))
    name = log_file_name(config(tmp_path, "--num_labels", "1000"), started)
    assert name == "resnet50_gpu2_b64_L1000_lr0.10_v2_20261121_101530.log"


def test_first_line_header_and_rows(tmp_path):
    run_log = RunLog(config(tmp_path, "--num_labels", "10"), time.time())
    run_log.write(EpochRow(1.5, 1.5, 64, 64, 1, 42.7, 0.5, 1, 0.025, 2.3, -1))
    run_log.close()
    lines = Path(run_log.path).read_text().splitlines()
    assert lines[0].startswith("# Namespace(") and "batch_size=64" in lines[0]
    assert ",".join(HEADER) == ORIGINAL_HEADER and lines[1] == ORIGINAL_HEADER
    assert lines[2] == "1.5,1.5,64,64,1,42.7,0.5,1,0.025,2.3,-1"
    assert re.fullmatch(
        r"resnet50_gpu2_b64_L10_lr0\.10_v2_\d{8}_\d{6}\.log", run_log.path.split("/")[-1]
    )


def test_an_existing_log_is_never_overwritten(tmp_path):
    started = time.time()
    first = RunLog(config(tmp_path), started)
    first.write(EpochRow(1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1))
    first.close()
    second = RunLog(config(tmp_path), started)
    second.close()
    assert second.path != first.path
    assert len(Path(first.path).read_text().splitlines()) == 3
