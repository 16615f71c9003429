"""The epoch loop: steps, evaluation, the run log and checkpoints."""

from __future__ import annotations

import logging
import os
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
from resnet50_trainer.errors import USAGE_EXIT_STATUS, Diverged, UserError
from resnet50_trainer.gpu_monitor import GpuMonitor
from resnet50_trainer.inputs import TrainInput, build_test_input, build_train_input
from resnet50_trainer.devices import replica_devices
from resnet50_trainer.model import build_model, build_split_model
from resnet50_trainer.optim import LearningRateSchedule, build_optimizer, set_learning_rate
from resnet50_trainer.precision import Precision
from resnet50_trainer.profiling import StepProfiler
from resnet50_trainer.progress import BAD_KEYS_NAMED, EpochProgress
from resnet50_trainer.runlog import NO_TEST_ACCURACY, EpochRow, RunLog

log = logging.getLogger(__name__)
DIVERGED_EXIT_STATUS = 1
NO_BAD_LOSS = torch.iinfo(torch.int64).max  # the watch's "no non-finite loss yet"


@dataclass
class EpochResult:
    loss: float
    accuracy: float
    images: int  # global
    seconds: float
    bad_records: int  # global
    bad_keys: list  # this process's first BAD_KEYS_NAMED


class DivergenceWatch:
    """Notices a loss or weight that is no longer finite without reading the device per step.

    Each step folds "is this loss finite" into a device-side first-bad-iteration (no sync); check()
    all-reduces that with "are the weights finite" and reads the result once. Every process calls
    it at the same steps and gets the same answer, so a diverged run stops everywhere at once.
    A float16 step that the gradient scaler skips has a finite loss and leaves the weights as they
    were: it passes."""

    def __init__(self, model: torch.nn.Module, loss_device: torch.device, device: torch.device):
        self.parameters = [parameter.detach() for parameter in model.parameters()]
        self.device = device  # collectives run on this process's own device
        self.first_bad_loss = torch.full((), NO_BAD_LOSS, dtype=torch.int64, device=loss_device)

    def record(self, loss: torch.Tensor, iteration: int) -> None:
        bad_here = torch.where(loss.detach().isfinite(), NO_BAD_LOSS, iteration)
        torch.minimum(self.first_bad_loss, bad_here, out=self.first_bad_loss)

    def check(self) -> tuple[Optional[int], bool]:
        """(the first global iteration whose loss was not finite on any process, or None; whether
        every weight is finite). One small all-reduce and one read."""
        verdict = torch.stack([self.first_bad_loss.to(self.device),
                               self.weights_finite().to(self.device, torch.int64)])
        with distributed.waiting_for_peers("the divergence check"):
            dist.all_reduce(verdict, op=dist.ReduceOp.MIN)
            first_bad_loss, weights_finite = verdict.tolist()  # NCCL: the wait is here
        return (None if first_bad_loss == NO_BAD_LOSS else first_bad_loss), bool(weights_finite)

    def weights_finite(self) -> torch.Tensor:
        """One 2-norm per tensor (the clip_grad_norm_ kernel), grouped by device: a model-parallel
        replica spans two. A NaN or inf weight makes its norm NaN or inf; so do finite weights
        whose squares overflow float32 (around 1e16 to 1e19), a run as lost as one with NaNs."""
        by_device: dict = {}
        for parameter in self.parameters:
            by_device.setdefault(parameter.device, []).append(parameter)
        finite = [torch.stack(torch._foreach_norm(group)).isfinite().all().to(self.device)
                  for group in by_device.values()]
        return torch.stack(finite).all()


class Trainer:
    def __init__(self, config: Config, placement: Placement, device: torch.device):
        self.config, self.placement, self.device = config, placement, device
        self.input: TrainInput = build_train_input(config, placement, device)
        self.test_input = build_test_input(config, placement, device)
        self.precision = Precision(config, device)
        self.model = self.precision.prepare_model(self._build_model())
        # The logits (and so the labels they are scored against) are on the replica's last device.
        self.output_device = self.model.output_device if config.model_parallel else device
        self.ddp = DistributedDataParallel(
            self.model, gradient_as_bucket_view=True,
            # A model-parallel replica spans two devices: DDP then takes no device_ids.
            device_ids=[device] if device.type == "cuda" and not config.model_parallel else None)
        # Compiling the DDP module lets torch.compile split graphs at DDP's bucket boundaries.
        self.train_model = torch.compile(self.ddp) if config.compile else self.ddp
        self.optimizer = build_optimizer(self.model, config)
        self.schedule = LearningRateSchedule(config.effective_learning_rate,
                                             self.input.steps_per_epoch, config.warmup_epochs)
        self.epoch = 0  # epochs completed
        self.step = 0  # steps done of the current epoch (non-zero only when resuming mid-epoch)
        self.iteration = 0  # global steps completed
        self.lineage = checkpoint.new_lineage()  # of this run's checkpoints; resume() adopts one
        # Sums of the epoch so far, carried by a mid-epoch checkpoint, and the run's totals so far,
        # so the log's cumulative columns continue across a resume.
        self.resumed_sums: Optional[torch.Tensor] = None
        self.resumed_seconds = 0.0
        self.total_seconds, self.total_images = 0.0, 0
        self.timeout_shortened = False
        # Only the first process shows GPUs (this machine's) and profiles; set up by train().
        self.gpu_monitor: Optional[GpuMonitor] = None
        self.profiler = StepProfiler(0, None)
        self.watch = DivergenceWatch(self.model, self.output_device, device)

    def _build_model(self) -> torch.nn.Module:
        config = self.config
        if not config.model_parallel:
            return build_model(config.num_layers, config.num_labels, config.num_channels).to(self.device)
        return build_split_model(config.num_layers, config.num_labels, config.num_channels,
                                 replica_devices(config, self.placement.local_rank),
                                 config.pipeline_chunks)

    def resume(self, path: str) -> None:
        """Continue exactly where the checkpoint left off: weights, momentum, epoch, step, LR and
        data order. The order and augmentation are functions of (seed, epoch, step, position)
        (data/loader.py), so the seed and the counters restore them; torch's RNG state is restored
        too, though after the weights are drawn nothing in training consumes it."""
        state = checkpoint.load_checkpoint(path, self.config.save_model_name,
                                           warn=self.placement.is_main)
        self._check_everyone_resumes(state)
        checkpoint.check_matches(state, self.config)
        checkpoint.check_fits(state, self.model, self.optimizer)
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            if state.get("scaler"):  # empty when the checkpoint's run had no float16 scaler
                self.precision.scaler.load_state_dict(state["scaler"])
            torch.set_rng_state(state["torch_rng_state"])
        except (RuntimeError, ValueError, KeyError, TypeError) as error:
            raise UserError(f"checkpoint {state['path']} cannot be loaded into this run "
                            f"({checkpoint.describe_error(error)}): give a checkpoint written by "
                            "resnet50-trainer for this model") from error
        self.lineage = checkpoint.lineage_of(state, self.config.checkpoint_dir)
        self.epoch, self.step, self.iteration = state["epoch"], state["step"], state["iteration"]
        self.total_seconds, self.total_images = state["total_seconds"], state["total_images"]
        if self.step:
            self.resumed_sums, self.resumed_seconds = state["epoch_sums"], state["epoch_seconds"]
        self.step, self.iteration = checkpoint.continue_with_global_batch(
            state, self.config, self.placement.world_size, self.input.steps_per_epoch,
            warn=self.placement.is_main)
        self._end_epoch_beyond_its_steps(state["path"])
        if self.placement.is_main:
            checkpoint.warn_of_changes(state, self.config, self.schedule(self.iteration))
        log.info("Resumed from %s: epoch %d done, %d steps into epoch %d, iteration %d, next LR %.5g",
                 state["path"], self.epoch, self.step, self.epoch + 1, self.iteration,
                 self.schedule(self.iteration))

    def _end_epoch_beyond_its_steps(self, path: str) -> None:
        """A mid-epoch checkpoint past the end of this run's shorter epoch (another --epoch_size or
        a smaller DB): that epoch ends at once, with the sums it had."""
        steps = self.input.steps_per_epoch
        if self.step < steps:
            return
        if self.placement.is_main:
            log.warning("Checkpoint %s is %d steps into epoch %d, but this run's epochs have %d "
                        "steps (--epoch_size or the DB changed): epoch %d ends without another "
                        "step and the run goes on with epoch %d", path, self.step, self.epoch + 1,
                        steps, self.epoch + 1, self.epoch + 2)
        self.step = steps

    def train_epoch(self) -> EpochResult:
        config, steps = self.config, self.input.steps_per_epoch
        self.input.epoch_plan.set_epoch(self.epoch, self.step)
        self.ddp.train()
        # Read from the device once, at the end: a per-step .item() would stall the GPU's queue.
        device_sums = torch.zeros(2, dtype=torch.float64, device=self.output_device)  # loss x images, correct
        images = bad = 0
        progress = EpochProgress(config, self.placement.is_main, self.epoch, steps, self.step,
                                 self.gpu_monitor)
        started = time.perf_counter() - self.resumed_seconds
        bad_keys = []
        try:
            for step, batch in enumerate(progress.batches(self.input.batches), start=self.step):
                loss, correct, labels = self._train_step(batch)
                device_sums += torch.stack([loss.detach().double() * len(labels), correct.double()])
                images, bad = images + len(labels), bad + len(batch.bad_keys)
                bad_keys += batch.bad_keys[:BAD_KEYS_NAMED - len(bad_keys)]
                progress.step(step, loss, correct, len(labels), batch.bad_keys)
                checkpoint_due = self._checkpoint_due(step)
                # Where the loop reads the device anyway, and before any save: never NaN weights.
                if checkpoint_due or (step + 1) % config.print_every == 0:
                    self.stop_if_diverged()
                if checkpoint_due:
                    self.step = step + 1
                    self.save(self._epoch_sums(device_sums, images, bad),
                              time.perf_counter() - started)
        finally:
            progress.close()
        self.stop_if_diverged()
        totals = self._epoch_sums(device_sums, images, bad)
        with distributed.waiting_for_peers("the all-reduce of the epoch's totals"):
            dist.all_reduce(totals)
            loss_sum, correct, images, bad = totals.tolist()  # waits for the last step, peers too
        seconds = time.perf_counter() - started
        self.step, self.resumed_sums, self.resumed_seconds = 0, None, 0.0
        return EpochResult(loss_sum / images, correct / images, int(images), seconds, int(bad), bad_keys)

    def _train_step(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step; (loss, correct, labels), still on the device."""
        labels = batch.labels.to(self.output_device, non_blocking=True)  # a no-op unless split
        set_learning_rate(self.optimizer, self.schedule(self.iteration))
        with distributed.waiting_for_peers("the step's buffer broadcast"), self.precision.autocast():
            logits = self.train_model(self.precision.inputs(batch.images))
            loss = F.cross_entropy(logits, labels)
        self.optimizer.zero_grad(set_to_none=True)
        with distributed.waiting_for_peers("the step's gradient all-reduce"):
            self.precision.backward_and_step(loss, self.optimizer)
        self.iteration += 1
        self.watch.record(loss, self.iteration)
        self._after_first_step()
        if self.profiler.step():
            self.stop_together(self.profiler.failure)
        return loss, (logits.argmax(1) == labels).sum(), labels

    def stop_if_diverged(self) -> None:
        """A loss or weight that is no longer finite ends the run on every process, before anything
        is saved; the first process names the iteration, the others leave quietly after it."""
        first_bad_loss, weights_finite = self.watch.check()
        if first_bad_loss is None and weights_finite:
            return
        if not self.placement.is_main:
            _leave_after_main(DIVERGED_EXIT_STATUS)
        if first_bad_loss is not None:
            what = f"the loss was no longer finite (inf or nan) at {self._position(first_bad_loss)}"
        else:
            what = (f"the weights were no longer finite (inf, nan, or too large to square in float32) by "
                    f"{self._position(self.iteration)}")
        config = self.config
        saved = checkpoint.saved_checkpoints(config.checkpoint_dir, config.save_model_name)
        # The newest checkpoint of this run's directory, else the one this run started from.
        last_good, resume_from = ((saved[-1].path, config.checkpoint_dir) if saved else
                                  (config.load_model_path, config.load_model_path))
        fix = "lower --base_learning_rate or add --warmup_epochs"
        advice = (f"the last good checkpoint {last_good} is kept: {fix}, then resume with "
                  f"--load_model_path {resume_from}" if last_good else
                  f"no checkpoint was written: {fix} and start again")
        raise Diverged(f"training diverged: {what}; {advice}")

    def _check_everyone_resumes(self, state: dict) -> None:
        """Every process continues the same checkpoint: machines with disks of their own may hold
        different newest ones (or none), and the replicas would part silently."""
        mine = (state["epoch"], state["step"], state["iteration"], state.get("lineage"))
        everyone: list = [None] * self.placement.world_size
        with distributed.waiting_for_peers("the comparison of the resumed checkpoints"):
            dist.all_gather_object(everyone, mine)
        differing = [rank for rank, theirs in enumerate(everyone) if theirs != everyone[0]]
        if not differing:
            return
        if not self.placement.is_main:
            _leave_after_main()
        epoch, step, _, _ = everyone[differing[0]]
        raise UserError(f"the processes would resume different checkpoints (rank 0: "
                        f"{state['path']}, {state['epoch']} epochs and {state['step']} steps "
                        f"done; rank {differing[0]}: {epoch} epochs and {step} steps done): give "
                        "every machine the same checkpoint, e.g. a --load_model_path file on "
                        "shared storage")

    def _position(self, iteration: int) -> str:
        epoch, step = divmod(iteration - 1, self.input.steps_per_epoch)
        return f"iteration {iteration} (epoch {epoch + 1}, step {step + 1})"

    def stop_together(self, failure: Optional[Exception],
                      what: str = "the first process's report on its writes") -> None:
        """The first process alone writes the run log, the trace and checkpoints. If that failed,
        every process stops with its exit status (1 for diverged weights, 2 for a failed write):
        the first reports it in one line, the others leave quietly after it (rather than each
        reporting the first as a lost peer)."""
        status = (0 if failure is None else DIVERGED_EXIT_STATUS if isinstance(failure, Diverged)
                  else USAGE_EXIT_STATUS)
        outcome = torch.tensor([status], device=self.device)
        with distributed.waiting_for_peers(what):
            dist.broadcast(outcome, src=0)
            status = int(outcome.item())  # NCCL: the wait is here
        if failure is not None:
            raise failure
        if status:
            _leave_after_main(status)

    def _epoch_sums(self, device_sums: torch.Tensor, images: int, bad: int) -> torch.Tensor:
        """This process's sums of the epoch so far: loss x images, correct, images, bad records.
        The first process also carries what a mid-epoch checkpoint had counted (globally)."""
        # Collectives run on this process's own device (the first of a model-parallel pair).
        sums = torch.cat([device_sums.to(self.device),
                          torch.tensor([images, bad], dtype=torch.float64, device=self.device)])
        if self.resumed_sums is not None and self.placement.is_main:
            sums += self.resumed_sums.to(sums)
        return sums

    def _checkpoint_due(self, step: int) -> bool:
        """Within an epoch, every --checkpoint_every_iters iterations; the epoch's end saves anyway."""
        every = self.config.checkpoint_every_iters
        return bool(every) and self.iteration % every == 0 and step + 1 < self.input.steps_per_epoch

    @torch.no_grad()
    def evaluate(self) -> Optional[float]:
        """Top-1 over the whole test DB, BN in eval mode, shared by all processes."""
        if self.test_input is None:
            return None
        self.model.eval()
        correct = torch.zeros(1, dtype=torch.float64, device=self.output_device)
        images = bad = 0
        for batch in self.test_input:  # on the device already
            if not len(batch.labels):  # every record of the batch failed
                bad += len(batch.bad_keys)
                continue
            good = batch.num_real  # filled-in copies are not scored
            with self.precision.autocast():
                predictions = self.model(self.precision.inputs(batch.images[:good])).argmax(1)
            correct += (predictions == batch.labels[:good].to(self.output_device)).sum()
            images, bad = images + good, bad + len(batch.bad_keys)
        self.model.train()
        counts = torch.cat([correct.to(self.device),
                            torch.tensor([images, bad], dtype=torch.float64, device=self.device)])
        with distributed.waiting_for_peers("the all-reduce of the test counts"):
            dist.all_reduce(counts)
            correct, images, bad = counts.tolist()  # NCCL: the wait is here
        if bad and self.placement.is_main:
            log.warning("Test accuracy over %d records: %d of the test DB's records could not be "
                        "read and were left out (resnet50-db inspect names them)", images, bad)
        return correct / max(images, 1)

    def save(self, epoch_sums: Optional[torch.Tensor] = None, epoch_seconds: float = 0.0) -> Optional[str]:
        """The first process writes; every process waits, so none runs ahead of a saved step, and
        learns whether the write failed, so all stop together, the first with its one line.

        Within an epoch, `epoch_sums` (this process's) are all-reduced so the checkpoint holds the
        epoch's global sums so far."""
        if epoch_sums is not None:
            epoch_sums = epoch_sums.clone()
            with distributed.waiting_for_peers("the all-reduce of the checkpoint's epoch sums"):
                dist.all_reduce(epoch_sums)
        path, failure = None, None
        if self.placement.is_main:
            config = self.config
            path = checkpoint.checkpoint_path(config.checkpoint_dir, config.save_model_name,
                                              self.epoch, self.step)
            try:
                self._write_checkpoint(path, epoch_sums, epoch_seconds)
            except (UserError, Diverged) as error:
                failure = error
        # Also the barrier after the write: no process runs ahead of a saved step.
        self.stop_together(failure, "the checkpoint barrier")
        return path

    def _write_checkpoint(self, path: str, epoch_sums: Optional[torch.Tensor],
                          epoch_seconds: float) -> None:
        """Never over good weights with diverged ones: non-finite weights end the run instead."""
        config, weights = self.config, self.model.state_dict()
        diverged = checkpoint.non_finite_tensors(weights)
        if diverged:
            more = f" and {len(diverged) - 1} more" if len(diverged) > 1 else ""
            raise Diverged(f"the weights are no longer finite at epoch "
                           f"{self.epoch + (1 if self.step else 0)}, iteration {self.iteration} "
                           f"({diverged[0]}{more}): {os.path.basename(path)} was not written and "
                           f"the checkpoints in {config.checkpoint_dir} are intact; resume from "
                           "the last one with a lower --base_learning_rate")
        checkpoint.save_checkpoint({
            "model": weights, "optimizer": self.optimizer.state_dict(),
            "scaler": self.precision.scaler.state_dict(),
            "epoch": self.epoch, "step": self.step, "iteration": self.iteration,
            "learning_rate": self.schedule(self.iteration),  # of the next step
            "seed": config.seed, "torch_rng_state": torch.get_rng_state(),
            "global_batch_size": config.global_batch_size,
            "epoch_sums": None if epoch_sums is None else epoch_sums.cpu(),
            "epoch_seconds": epoch_seconds,
            "total_seconds": self.total_seconds, "total_images": self.total_images,
            "arguments": config.to_dict(), "world_size": self.placement.world_size,
            "lineage": self.lineage,
        }, path)
        checkpoint.remove_older(config.checkpoint_dir, config.save_model_name,
                                config.keep_checkpoints, self.lineage, path)

    def check_bad_records(self, result: EpochResult) -> None:
        """Name the epoch's count; above --max_bad_records stop the run, naming the first keys.
        Every process reaches the same verdict from the global counts; the first one reports it."""
        if not result.bad_records:
            return
        if self.placement.is_main:
            log.warning("Epoch %d: %d of %d records skipped as unreadable (the first %d of each "
                        "process named above)", self.epoch + 1, result.bad_records, result.images,
                        BAD_KEYS_NAMED)
        share = result.bad_records / result.images
        if share <= self.config.max_bad_records:
            return
        gathered = [None] * self.placement.world_size
        with distributed.waiting_for_peers("the all-gather of the bad records' keys"):
            dist.all_gather_object(gathered, result.bad_keys)
        if not self.placement.is_main:
            _leave_after_main()
        first = [key.decode(errors="replace") for keys in gathered for key in keys][:BAD_KEYS_NAMED]
        raise UserError(f"{result.bad_records} of {result.images} records ({share:.1%}) read in "
                        f"epoch {self.epoch + 1} of {self.config.train_data} could not be read "
                        f"(first: {', '.join(first)}), above --max_bad_records "
                        f"{self.config.max_bad_records}: repair the DB (resnet50-db inspect names "
                        "them) or raise --max_bad_records")

    def _after_first_step(self) -> None:
        if not self.timeout_shortened:
            distributed.shorten_timeout(self.config)
            self.timeout_shortened = True


def _leave_after_main(status: int = USAGE_EXIT_STATUS) -> None:
    """Exit with `status` once the first process, which reports a run-wide stop, has gone: its
    line is never lost to the launcher ending the run on this process's exit."""
    try:
        dist.barrier()  # the first process never joins: this returns when it has exited
    except (dist.DistError, RuntimeError):
        pass
    raise SystemExit(status)


def train(config: Config, placement: Placement, device: torch.device) -> None:
    """The whole run on this process: resume, epochs, log rows, checkpoints, the summary."""
    started = time.time()
    trainer = Trainer(config, placement, device)
    if config.load_model_path:
        trainer.resume(config.load_model_path)
    if trainer.epoch >= config.num_epochs:
        log.info("Nothing to train: the checkpoint has completed all %d epochs", config.num_epochs)
        return
    runlog = _open_run_log(trainer, started)
    trace_path = os.path.splitext(runlog.path)[0] + ".trace.json" if runlog else None
    trainer.profiler = StepProfiler(config.profile_iters, trace_path)
    if runlog:
        trainer.gpu_monitor = GpuMonitor(config.gpus).start()
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
            trainer.epoch += 1
            trainer.total_seconds += result.seconds
            trainer.total_images += result.images
            # Saved before the evaluation, so nothing that goes wrong there costs the epoch.
            saved = trainer.save()
            rows.append(_row(result, trainer, trainer.evaluate()))
            trainer.stop_together(_write_row(runlog, rows[-1]))
            log.info("Epoch %d: loss %.4f, accuracy %.4f, test accuracy %s, %.1f images/sec%s",
                     trainer.epoch, result.loss, result.accuracy, rows[-1].test_accuracy,
                     result.images / result.seconds, _peak_memory(device))
    if trainer.profiler.close():  # the run was shorter than the profile
        trainer.stop_together(trainer.profiler.failure)
    digest = distributed.parameters_digest_everywhere(trainer.model)
    if runlog:
        trainer.gpu_monitor.stop()
        runlog.close()
        _summarise(rows, runlog.path, saved, time.time() - started)
        log.info("Parameters identical on all %d processes (sha256 %s)", placement.world_size, digest)


def _open_run_log(trainer: Trainer, started: float) -> Optional[RunLog]:
    """The first process's new run log; None on the others. If it cannot be made, all stop."""
    runlog = failure = None
    if trainer.placement.is_main:
        try:
            runlog = RunLog(trainer.config, started)
        except UserError as error:
            failure = error
    trainer.stop_together(failure)
    return runlog


def _write_row(runlog: Optional[RunLog], row: EpochRow) -> Optional[UserError]:
    """The row appended to the log (first process); the failure to write it, if any."""
    try:
        if runlog:
            runlog.write(row)
    except UserError as failure:
        return failure
    return None


def _peak_memory(device: torch.device) -> str:
    if device.type != "cuda":
        return ""
    return f", peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB"


def _row(result: EpochResult, trainer: Trainer, test_accuracy: Optional[float]) -> EpochRow:
    return EpochRow(
        time_spent=round(result.seconds, 3),
        cumulative_time_spent=round(trainer.total_seconds, 3),
        input_count=result.images,
        cumulative_input_count=trainer.total_images,
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
