"""What the first process shows while an epoch runs: a tqdm bar with loss, images/s, the share of
time spent waiting for input (high: the input pipeline starves the devices) and, on GPUs, their
utilisation and memory; and the original's console lines. Other processes only name bad records.

The bar never waits for the device: on CUDA it shows the loss of an earlier step, copied to pinned
host memory behind the step's work (LossReader). The console lines every --print_every steps read
the loss and accuracy of that very step (a wait for the device's queue, where the training loop
reads the device anyway: its divergence check)."""

from __future__ import annotations

import logging
import time
from typing import Callable

import torch
from tqdm import tqdm

from resnet50_trainer.config.settings import Config
from resnet50_trainer.reporting.gpu_monitor import GpuMonitor

log = logging.getLogger(__name__)
BAD_KEYS_NAMED = 10  # bad records named one by one in an epoch; the rest are counted
PROGRESS_REFRESH_S = 1.0  # the bar's refreshes, at most once a second


class LossReader:
    """A step's loss for the bar without a host sync: on CUDA a non-blocking copy into pinned host
    memory and an event behind it; read() gives the latest copy that has arrived (None before the
    first) and queues the next once the last has arrived. Elsewhere the value itself."""

    def __init__(self) -> None:
        self.host: torch.Tensor | None = None
        self.arrived: torch.cuda.Event | None = None
        self.value: float | None = None

    def read(self, loss: torch.Tensor) -> float | None:
        if loss.device.type != "cuda":
            return loss.item()
        # An event is recorded behind a copy into host: where there is one, there is the other.
        if self.arrived is not None and self.host is not None and self.arrived.query():
            self.value, self.arrived = self.host.item(), None  # host memory: no device sync
        if self.arrived is None:
            if self.host is None:
                self.host = torch.empty((), dtype=torch.float32, pin_memory=True)
            self.host.copy_(loss.detach().float(), non_blocking=True)
            self.arrived = torch.cuda.Event()
            self.arrived.record(torch.cuda.current_stream(loss.device))
        return self.value


class EpochProgress:
    """Refreshes at most once a second (without waiting for the device) and prints every
    --print_every steps (reading the device), never per step."""

    def __init__(
        self,
        config: Config,
        is_main: bool,
        epoch: int,
        steps: int,
        start_step: int = 0,
        gpu_monitor: GpuMonitor | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.config, self.is_main, self.epoch, self.steps = config, is_main, epoch, steps
        self.gpu_monitor = gpu_monitor
        self.clock = clock
        self.bar = tqdm(
            total=steps,
            initial=start_step,
            desc=f"epoch {epoch + 1}/{config.num_epochs}",
            unit="step",
            disable=not is_main or None,
            dynamic_ncols=True,
            leave=False,
        )
        self.bad_named = 0
        self.loss_reader = LossReader()
        self.waited = 0.0
        self.started = self.last_refresh = clock()
        self.interval_started, self.interval_steps = self.started, 0

    def batches(self, batches):
        iterator = iter(batches)
        while True:
            before = self.clock()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            self.waited += self.clock() - before
            yield batch

    @property
    def input_wait_share(self) -> float:
        """Share of the epoch's time so far spent waiting for the next batch."""
        return self.waited / max(self.clock() - self.started, 1e-9)

    def step(
        self, step: int, loss: torch.Tensor, correct: torch.Tensor, images: int, bad_keys
    ) -> tuple[float, float] | None:
        """The step's (loss, accuracy) where it printed them (the first process, every
        --print_every steps), else None."""
        for key in bad_keys:
            self.bad_named += 1
            if self.bad_named <= BAD_KEYS_NAMED:
                log.warning("Skipped undecodable record %r", key)
        if not self.is_main:
            return None
        self.bar.update(1)
        self.interval_steps += 1
        now = self.clock()
        config = self.config
        if (step + 1) % config.print_every == 0 or step + 1 == self.steps:
            rate = self.interval_steps * config.global_batch_size / (now - self.interval_started)
            log.info(
                "Finished iteration %d/%d of epoch %d (%.2f images/sec)",
                step + 1,
                self.steps,
                self.epoch + 1,
                rate,
            )
            # A wait for the device (see the module's docstring).
            printed = loss.item(), correct.item() / images
            log.info("Training loss: %.4f, accuracy: %.4f", *printed)
            self.interval_started, self.interval_steps = now, 0
            return printed
        if now - self.last_refresh >= PROGRESS_REFRESH_S and not self.bar.disable:
            elapsed = now - self.started
            # Images since this process (re)started the epoch, not since a resumed epoch began.
            images = (self.bar.n - self.bar.initial) * config.global_batch_size
            shown_loss = self.loss_reader.read(loss)
            postfix = {
                "loss": "..." if shown_loss is None else f"{shown_loss:.3f}",
                "img_s": f"{images / elapsed:.0f}",
                "input_wait": f"{self.input_wait_share:.0%}",
            }
            gpus = self.gpu_monitor.summary() if self.gpu_monitor else None
            if gpus:
                postfix["gpu"] = gpus
            self.bar.set_postfix(postfix)
            self.last_refresh = now
        return None

    def close(self) -> None:
        self.bar.close()
