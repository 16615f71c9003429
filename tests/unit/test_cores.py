"""The cores a run takes are those its process may run on (a Slurm task's cpuset, `taskset`), not
the machine's: its threads and its default input processes follow them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.trainer_runs import REPOSITORY

PRINT_SHARES = (
    "import torch\n"
    "from resnet50_trainer.config.cores import available_cores\n"
    "from resnet50_trainer.distributed.devices import claim_device\n"
    "from tests.support.trainer_runs import config_of\n"
    "config = config_of('--train_data', 'null', '--use_cpu')\n"
    "claim_device(config, 0)\n"
    "print(available_cores(), torch.get_num_threads(), config.num_workers)\n"
)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to leave one out")
def test_a_process_pinned_to_one_core_takes_one_thread_and_one_input_process():
    pinned = subprocess.run(
        [sys.executable, "-c", PRINT_SHARES],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": REPOSITORY},
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
    )
    assert pinned.returncode == 0, pinned.stderr
    assert pinned.stdout.split() == ["1", "1", "1"]
