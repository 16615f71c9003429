"""What the progress display measures: the input-wait share, and GPU monitoring off on CPU."""

from __future__ import annotations

import pytest
import torch

from resnet50_trainer.reporting.gpu_monitor import GpuMonitor
from resnet50_trainer.reporting.progress import EpochProgress
from tests.support.trainer_runs import config_of

INPUT_S = 0.03  # what each batch takes to arrive


class Clock:
    """Time that passes only when the test says so: the shares below are exact, on any machine."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def slow_input(clock: Clock, count: int):
    for index in range(count):
        clock.now += INPUT_S  # the loader's wait for this batch
        yield index


def measure_share(step_s: float, count: int = 10) -> float:
    config = config_of("--train_data", "null", "--use_cpu")
    clock = Clock()
    progress = EpochProgress(config, is_main=False, epoch=0, steps=count, clock=clock)
    for index in progress.batches(slow_input(clock, count)):
        clock.now += step_s  # the "training step"
        progress.step(index, torch.tensor(1.0), torch.tensor(1.0), 8, bad_keys=[])
    share = progress.input_wait_share
    progress.close()
    return share


def test_input_wait_share_of_a_starved_loop():
    # Input takes 30 ms, the step 10 ms: three quarters of the time is spent waiting.
    assert measure_share(step_s=0.01) == pytest.approx(0.75)


def test_input_wait_share_of_a_fed_loop():
    # Input takes 30 ms, the step 90 ms: a quarter.
    assert measure_share(step_s=0.09) == pytest.approx(0.25)


def test_a_loop_that_never_waits_for_input():
    assert measure_share(step_s=0.05, count=0) == 0.0


def test_gpu_monitor_is_off_without_gpus():
    monitor = GpuMonitor([]).start()
    assert not monitor.enabled and monitor.summary() is None
    monitor.stop()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the path of a machine without NVML")
def test_gpu_monitor_without_nvml_is_off_instead_of_failing():
    monitor = GpuMonitor([0]).start()
    assert not monitor.enabled and monitor.summary() is None
    monitor.stop()
