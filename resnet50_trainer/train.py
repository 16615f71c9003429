"""The epoch loop: steps, evaluation, the run log and checkpoints."""

from __future__ import annotations

import logging
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from tqdm.contrib.logging import logging_redirect_tqdm

from resnet50_trainer import checkpoint, distributed
from resnet50_trainer.config import Config
from resnet50_trainer.distributed import Placement
from resnet50_trainer.errors import UserError
from resnet50_trainer.gpu_monitor import GpuMonitor
from resnet50_trainer.inputs import TrainInput, build_test_input, build_train_input
from resnet50_trainer.model import build_model
from resnet50_trainer.optim import LearningRateSchedule, build_optimizer, set_learning_rate
from resnet50_trainer.precision import Precision
from resnet50_trainer.profiling import StepProfiler
from resnet50_trainer.progress import EpochProgress
from resnet50_trainer.runlog import NO_TEST_ACCURACY, EpochRow, RunLog

log = logging.getLogger(__name__)


def check_outputs_writable(config: Config) -> None:
    """Fail before any work if the log or checkpoint directory cannot take files."""
    for flag, directory in (("--log_dir", config.log_dir), ("--checkpoint_dir", config.checkpoint_dir)):
        try:
            os.makedirs(directory, exist_ok=True)
            with tempfile.TemporaryFile(dir=directory):
                pass
        except OSError as error:
            raise UserError(f"{flag} {directory} cannot be written ({error.strerror}): "
                            "choose a writable directory") from None


@dataclass
class EpochResult:
    loss: float
    accuracy: float
    images: int  # global
    seconds: float
    bad_records: int  # global


class Trainer:
    def __init__(self, config: Config, placement: Placement, device: torch.device):
        self.config, self.placement, self.device = config, placement, device
        self.input: TrainInput = build_train_input(config, placement, device)
        self.test_input = build_test_input(config, placement, device)
        self.precision = Precision(config, device)
        self.model = self.precision.prepare_model(
            build_model(config.num_layers, config.num_labels, config.num_channels).to(device))
        self.ddp = DistributedDataParallel(
            self.model, device_ids=[device] if device.type == "cuda" else None,
            gradient_as_bucket_view=True)
        # Compiling the DDP module lets torch.compile split graphs at DDP's bucket boundaries.
        self.train_model = torch.compile(self.ddp) if config.compile else self.ddp
        self.optimizer = build_optimizer(self.model, config)
        self.schedule = LearningRateSchedule(config.effective_learning_rate,
                                             self.input.steps_per_epoch, config.warmup_epochs)
        self.epoch = 0  # epochs completed
        self.iteration = 0  # global steps completed
        self.timeout_shortened = False
        # Only the first process shows GPUs (this machine's) and profiles; set up by train().
        self.gpu_monitor: Optional[GpuMonitor] = None
        self.profiler = StepProfiler(0, None)

    def resume(self, path: str) -> None:
        state = checkpoint.load_checkpoint(path)
        saved = state.get("arguments", {})
        for name in ("num_layers", "num_labels", "num_channels"):
            if saved.get(name) != getattr(self.config, name):
                raise UserError(f"checkpoint {path} was made with --{name} {saved.get(name)}, this run "
                                f"has {getattr(self.config, name)}: use the same value or another checkpoint")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.precision.scaler.load_state_dict(state.get("scaler", {}))
        self.epoch, self.iteration = state["epoch"], state["iteration"]
        log.info("Resumed from %s: epoch %d done, iteration %d", path, self.epoch, self.iteration)

    def train_epoch(self) -> EpochResult:
        config, steps = self.config, self.input.steps_per_epoch
        self.input.epoch_plan.set_epoch(self.epoch)
        self.ddp.train()
        # Read from the device once, at the end: a per-step .item() would stall the GPU's queue.
        sums = torch.zeros(2, dtype=torch.float64, device=self.device)  # loss x images, correct
        images = bad = 0
        progress = EpochProgress(config, self.placement.is_main, self.epoch, steps, self.gpu_monitor)
        started = time.perf_counter()
        for step, batch in enumerate(progress.batches(self.input.batches)):  # already on the device
            labels = batch.labels
            set_learning_rate(self.optimizer, self.schedule(self.iteration))
            with self.precision.autocast():
                logits = self.train_model(self.precision.inputs(batch.images))
                loss = F.cross_entropy(logits, labels)
            self.optimizer.zero_grad(set_to_none=True)
            self.precision.backward_and_step(loss, self.optimizer)
            self.iteration += 1
            self._after_first_step()
            self.profiler.step()
            correct = (logits.argmax(1) == labels).sum()
            sums += torch.stack([loss.detach().double() * len(labels), correct.double()])
            images, bad = images + len(labels), bad + len(batch.bad_keys)
            progress.step(step, loss, correct, len(labels), batch.bad_keys)
        progress.close()
        totals = torch.cat([sums, torch.tensor([images, bad], dtype=torch.float64, device=self.device)])
        dist.all_reduce(totals)
        loss_sum, correct, images, bad = totals.tolist()  # waits for the device's last step
        seconds = time.perf_counter() - started
        return EpochResult(loss_sum / images, correct / images, int(images), seconds, int(bad))

    @torch.no_grad()
    def evaluate(self) -> Optional[float]:
        """Top-1 over the whole test DB, BN in eval mode, shared by all processes."""
        if self.test_input is None:
            return None
        self.model.eval()
        correct = torch.zeros(1, dtype=torch.float64, device=self.device)
        images = 0
        for batch in self.test_input:  # already on the device
            good = len(batch.labels) - len(batch.bad_keys)  # filled-in copies are not scored
            with self.precision.autocast():
                predictions = self.model(self.precision.inputs(batch.images[:good])).argmax(1)
            correct += (predictions == batch.labels[:good]).sum()
            images += good
        self.model.train()
        counts = torch.cat([correct, torch.tensor([images], dtype=torch.float64, device=self.device)])
        dist.all_reduce(counts)
        correct, images = counts.tolist()
        return correct / max(images, 1)

    def save(self) -> Optional[str]:
        """The first process writes; every process waits, so none runs ahead of a saved epoch."""
        path = None
        if self.placement.is_main:
            config = self.config
            path = checkpoint.checkpoint_path(config.checkpoint_dir, config.save_model_name, self.epoch)
            checkpoint.save_checkpoint({
                "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scaler": self.precision.scaler.state_dict(),
                "epoch": self.epoch, "iteration": self.iteration,
                "arguments": config.to_dict(), "world_size": self.placement.world_size,
            }, path)
            checkpoint.remove_older(config.checkpoint_dir, config.save_model_name, keep=1)
        dist.barrier()
        return path

    def check_bad_records(self, result: EpochResult) -> None:
        if result.bad_records:
            log.warning("Epoch %d: %d records skipped as undecodable", self.epoch + 1, result.bad_records)
        share = result.bad_records / (result.images + result.bad_records)
        if share > self.config.max_bad_records:
            raise UserError(f"{result.bad_records} of {result.images} records ({share:.1%}) in epoch "
                            f"{self.epoch + 1} of {self.config.train_data} failed to decode, above "
                            f"--max_bad_records {self.config.max_bad_records}: repair the DB (resnet50-db "
                            "inspect names them) or raise --max_bad_records")

    def _after_first_step(self) -> None:
        if not self.timeout_shortened:
            distributed.shorten_timeout(self.config)
            self.timeout_shortened = True


def train(config: Config, placement: Placement, device: torch.device) -> None:
    """The whole run on this process: resume, epochs, log rows, checkpoints, the summary."""
    started = time.time()
    trainer = Trainer(config, placement, device)
    if config.load_model_path:
        trainer.resume(config.load_model_path)
    if trainer.epoch >= config.num_epochs:
        log.info("Nothing to train: the checkpoint has completed all %d epochs", config.num_epochs)
        return
    runlog = RunLog(config, started) if placement.is_main else None
    if runlog:
        trainer.gpu_monitor = GpuMonitor(config.gpus).start()
        trainer.profiler = StepProfiler(config.profile_iters,
                                        os.path.splitext(runlog.path)[0] + ".trace.json")
    log.info("ResNet-%d, %d processes x %d images = global batch %d, effective LR %.5g "
             "(base %g x %d / 256), %d iterations per epoch%s",
             config.num_layers, placement.world_size, config.device_batch_size,
             config.global_batch_size, config.effective_learning_rate, config.base_learning_rate,
             config.global_batch_size, trainer.input.steps_per_epoch,
             f"; log {runlog.path}" if runlog else "")
    rows = []
    with logging_redirect_tqdm():
        while trainer.epoch < config.num_epochs:
            result = trainer.train_epoch()
            trainer.check_bad_records(result)
            test_accuracy = trainer.evaluate()
            trainer.epoch += 1
            rows.append(_row(rows, result, trainer, test_accuracy))
            if runlog:
                runlog.write(rows[-1])
            log.info("Epoch %d: loss %.4f, accuracy %.4f, test accuracy %s, %.1f images/sec%s",
                     trainer.epoch, result.loss, result.accuracy, rows[-1].test_accuracy,
                     result.images / result.seconds, _peak_memory(device))
            saved = trainer.save()
    digest = distributed.parameters_digest_everywhere(trainer.model)
    if runlog:
        trainer.profiler.close()
        trainer.gpu_monitor.stop()
        runlog.close()
        _summarise(rows, runlog.path, saved, time.time() - started)
        log.info("Parameters identical on all %d processes (sha256 %s)", placement.world_size, digest)


def _peak_memory(device: torch.device) -> str:
    if device.type != "cuda":
        return ""
    return f", peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB"


def _row(rows: list, result: EpochResult, trainer: Trainer, test_accuracy: Optional[float]) -> EpochRow:
    previous = rows[-1] if rows else None
    return EpochRow(
        time_spent=round(result.seconds, 3),
        cumulative_time_spent=round(result.seconds + (previous.cumulative_time_spent if previous else 0), 3),
        input_count=result.images,
        cumulative_input_count=result.images + (previous.cumulative_input_count if previous else 0),
        cumulative_batch_count=trainer.iteration,
        inputs_per_sec=round(result.images / result.seconds, 2),
        accuracy=round(result.accuracy, 6), epoch=trainer.epoch,
        learning_rate=trainer.schedule(trainer.iteration - 1), loss=round(result.loss, 6),
        test_accuracy=NO_TEST_ACCURACY if test_accuracy is None else round(test_accuracy, 6))


def _summarise(rows: list, log_path: str, checkpoint_path: Optional[str], seconds: float) -> None:
    mean_rate = sum(row.inputs_per_sec for row in rows) / len(rows)
    best = max(rows, key=lambda row: row.test_accuracy)
    log.info("Done in %.1f s: %.1f images/sec on average per epoch; best test accuracy %s; log %s; "
             "checkpoint %s", seconds, mean_rate,
             f"{best.test_accuracy:.4f} (epoch {best.epoch})" if best.test_accuracy >= 0 else "n/a",
             log_path, checkpoint_path)
