"""The epoch loop: steps, the divergence checks, mid-epoch checkpoints and, after each epoch, the
bad-record verdict, the epoch's checkpoint, the evaluation and the log row. The only code that
advances the run's state (checkpoint/run_state.py); the policies it applies return verdicts, and
it stops the run with them (distributed/stopping.py)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist
from torch.profiler import record_function

from resnet50_trainer.checkpoint.files import checkpoint_path
from resnet50_trainer.checkpoint.run_state import RunState
from resnet50_trainer.checkpoint.saver import CheckpointSaver
from resnet50_trainer.config.settings import Config
from resnet50_trainer.data.batch import TrainingLabelOutside
from resnet50_trainer.data.prefetch import StopWhileWaiting
from resnet50_trainer.data.spans import CHECKPOINT, EVALUATION
from resnet50_trainer.distributed import process_group
from resnet50_trainer.distributed.pausing import pause_asked, pause_together
from resnet50_trainer.distributed.preemption import stop_signal, stop_signal_name
from resnet50_trainer.distributed.stopping import stop_run, stop_together
from resnet50_trainer.errors import (
    EXIT_STATUS,
    PREEMPTED_EXIT_STATUS,
    Diverged,
    Preempted,
    exit_status,
    shown,
)
from resnet50_trainer.model.optim import set_learning_rate
from resnet50_trainer.model.replica import Learner
from resnet50_trainer.reporting.gpu_monitor import GpuMonitor
from resnet50_trainer.reporting.profiling import StepProfiler
from resnet50_trainer.reporting.progress import BAD_KEYS_NAMED, EpochProgress
from resnet50_trainer.reporting.runlog import EpochRow, RunLog
from resnet50_trainer.reporting.tensorboard import TensorBoardLog
from resnet50_trainer.train.bad_records import bad_records_verdict
from resnet50_trainer.train.batch_mixing import BatchMixing
from resnet50_trainer.train.divergence import DivergenceWatch, divergence_report
from resnet50_trainer.train.epoch_report import (
    EpochResult,
    epoch_row,
    peak_memory,
    test_accuracy_text,
    write_row,
)
from resnet50_trainer.train.evaluation import (
    evaluate,
    evaluate_ema,
    refuse_labels_outside,
)
from resnet50_trainer.train.inputs import TrainInput
from resnet50_trainer.train.labels import refuse_training_label
from resnet50_trainer.train.step import forward_backward

log = logging.getLogger(__name__)
# Every process learns of a stop signal in the divergence check's all-reduce, which the loop
# already reads every --print_every iterations: it runs at least this often too, so a signalled
# run stops within this many steps (seconds on a GPU, inside Slurm's and Kubernetes' 30 s grace)
# at the same step everywhere. A read each step would stall a GPU's queue every step; one in 20
# drains it once in 20 steps, and on the CPU it is a small all-reduce.
STOP_CHECK_EVERY_ITERS = 20


@dataclass
class Outputs:
    """Where the first process reports the run: the run log (None on the others), the GPUs'
    utilisation on the progress bar, the profiler (every process counts its steps), and
    --tensorboard's event files (None without it, and on the others)."""

    runlog: RunLog | None
    gpu_monitor: GpuMonitor | None
    profiler: StepProfiler
    tensorboard: TensorBoardLog | None = None


def wait_for_profile_write(profiler: StepProfiler, config: Config, device: torch.device) -> None:
    """Every process, once the profile has ended: the others wait while the first writes it
    (seconds, a minute for a long one on a GPU), as at a checkpoint up to --first_iter_timeout,
    and all stop together if it could not be written."""
    with process_group.long_wait(config):
        stop_together(profiler.failure, device, "the first process's writing of the profile")


class EpochLoop:
    def __init__(
        self,
        config: Config,
        learner: Learner,
        train_input: TrainInput,
        test_batches,
        run: RunState,
        saver: CheckpointSaver,
        outputs: Outputs,
    ):
        placement, replica = learner.placement, learner.replica
        self.config, self.placement, self.device = config, placement, learner.device
        self.replica, self.schedule = replica, learner.schedule
        self.saver, self.outputs = saver, outputs
        self.input, self.test_batches, self.run = train_input, test_batches, run
        self.watch = DivergenceWatch(replica.model, replica.output_device, learner.device)
        self.mixing = BatchMixing(
            config.mixup_alpha, config.cutmix_alpha, config.num_labels, config.seed, placement.rank
        )
        self.timeout_shortened = False
        self.rows: list[EpochRow] = []
        self.last_saved: str | None = None
        self.stop_signalled = False  # agreed by every process at the last check

    def run_epochs(self) -> None:
        config, run = self.config, self.run
        while run.epochs_done < config.num_epochs:
            result = self.train_epoch()
            failure = bad_records_verdict(
                result.bad_records,
                result.images,
                result.bad_keys,
                run.epochs_done + 1,
                config,
                self.placement.world_size,
                self.placement.is_main,
            )
            if failure is not None:
                stop_run(failure if self.placement.is_main else None, exit_status(failure))
            run.epoch_done(result.seconds, result.images)
            # Saved before the evaluation, so nothing that goes wrong there costs the epoch.
            with record_function(CHECKPOINT):
                self.last_saved = self.saver.save(run)
            is_main = self.placement.is_main
            with record_function(EVALUATION):
                try:
                    test_accuracy = evaluate(self.replica, self.test_batches, self.device, is_main)
                    refuse_labels_outside(test_accuracy, config, is_main)
                    ema_accuracy = evaluate_ema(
                        self.replica, self.test_batches, self.device, is_main
                    )
                except StopWhileWaiting:  # saved above, on every process; its peers wait for it
                    raise self._preempted(self._epoch_checkpoint()) from None
            logged = ema_accuracy if config.ema_for_test else test_accuracy
            self.rows.append(
                epoch_row(result, self.run, self.schedule(self.run.iteration - 1), logged)
            )
            failure = write_row(self.outputs.runlog, self.rows[-1])
            if self.outputs.tensorboard and not failure:  # its failure held since a step, too
                failure = self.outputs.tensorboard.epoch(
                    self.rows[-1], ema_accuracy.top1 if ema_accuracy else None
                )
            stop_together(failure, self.device)
            if self.stop_signalled and run.epochs_done < config.num_epochs:
                self._stop_preempted()  # at the epoch's end, saved above
            log.info(
                "Epoch %d: loss %.4f, accuracy %.4f, test accuracy %s%s, %.1f images/sec%s",
                run.epochs_done,
                result.loss,
                result.accuracy,
                test_accuracy_text(test_accuracy),
                f"; EMA test accuracy {test_accuracy_text(ema_accuracy)}" if ema_accuracy else "",
                result.images / result.seconds,
                peak_memory(self.device),
            )

    def train_epoch(self) -> EpochResult:
        config, run, steps = self.config, self.run, self.input.steps_per_epoch
        self.input.epoch_plan.set_epoch(run.epochs_done, run.steps_into_epoch)
        run.read_order = self.input.epoch_plan.epoch_order_shape
        self.replica.train_module.train()
        # Read from the device once, at the end: a per-step .item() would stall the GPU's queue.
        device_sums = torch.zeros(
            2,
            dtype=torch.float64,  # loss x images, correct
            device=self.replica.output_device,
        )
        images = bad = 0
        progress = EpochProgress(
            config,
            self.placement.is_main,
            run.epochs_done,
            steps,
            run.steps_into_epoch,
            self.outputs.gpu_monitor,
        )
        started = time.perf_counter() - run.resumed_seconds
        bad_keys: list = []
        try:
            for batch in progress.batches(self.input.batches):
                loss, correct, labels = self._train_step(batch)
                if self.outputs.profiler.step():  # the profile ended with this step
                    wait_for_profile_write(self.outputs.profiler, config, self.device)
                device_sums += torch.stack([loss.detach().double() * len(labels), correct.double()])
                images, bad = images + len(labels), bad + len(batch.bad_keys)
                bad_keys += batch.bad_keys[: BAD_KEYS_NAMED - len(bad_keys)]
                printed = progress.step(
                    run.steps_into_epoch - 1, loss, correct, len(labels), batch.bad_keys
                )
                if printed and self.outputs.tensorboard:
                    self.outputs.tensorboard.step(
                        run.iteration,
                        *printed,
                        self.schedule(run.iteration - 1),
                        progress.input_wait_share,
                    )
                checkpoint_due = self._checkpoint_due()
                # Where the loop reads the device anyway, and before any save: never NaN weights.
                if checkpoint_due or self._check_due():
                    self._check()
                mid_epoch = run.steps_into_epoch < steps
                if checkpoint_due or (self.stop_signalled and mid_epoch):
                    self._save_mid_epoch(
                        self._epoch_sums(device_sums, images, bad), time.perf_counter() - started
                    )
                if self.stop_signalled and mid_epoch:
                    self._stop_preempted()
        except TrainingLabelOutside as outside:
            raise refuse_training_label(config, outside.key, outside.label) from None
        except StopWhileWaiting as stuck:
            sums = self._epoch_sums(device_sums, images, bad)
            self._stop_waiting(stuck, sums, time.perf_counter() - started)
        finally:
            progress.close()
        self._check()
        totals = self._epoch_sums(device_sums, images, bad)
        with process_group.waiting_for_peers("the all-reduce of the epoch's totals"):
            dist.all_reduce(totals)
            loss_sum, correct, images, bad = totals.tolist()  # the last step, peers too
        seconds = time.perf_counter() - started
        return EpochResult(
            loss_sum / images, correct / images, int(images), seconds, int(bad), bad_keys
        )

    def _train_step(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step, in --iter_size passes; (loss, correct, labels), still on the device."""
        replica, run, passes = self.replica, self.run, self.config.iter_size
        labels = batch.labels.to(replica.output_device, non_blocking=True)  # a no-op unless split
        set_learning_rate(replica.optimizer, self.schedule(run.iteration))
        # Mixed over the process's whole batch, then cut into the passes.
        mixed = self.mixing(batch.images, labels, run.iteration)
        replica.optimizer.zero_grad(set_to_none=True)
        loss = torch.zeros((), device=labels.device)
        correct = torch.zeros((), dtype=torch.long, device=labels.device)
        passes_of = [part.chunk(passes) for part in mixed]  # images, targets, dominant labels
        # A batch cut into fewer passes would skip the last pass's all-reduce on this process.
        assert all(len(part) == passes for part in passes_of), "a batch short of --iter_size"
        for index, (images, targets, dominant_labels) in enumerate(zip(*passes_of)):
            pass_loss, pass_correct = forward_backward(
                self.replica,
                (images, targets, dominant_labels),
                passes,
                last=index == passes - 1,
                label_smoothing=self.config.label_smoothing,
            )
            loss, correct = loss + pass_loss, correct + pass_correct
        replica.precision.step(replica.optimizer)
        run.step_done()
        if replica.ema is not None:
            replica.ema.update(replica.model, run.iteration)
        self.watch.record(loss, run.iteration)
        if not self.timeout_shortened:  # after the first step, a silent peer ends the run sooner
            process_group.shorten_timeout(self.config)
            self.timeout_shortened = True
        return loss, correct, labels

    def _check_due(self) -> bool:
        return (
            self.run.steps_into_epoch % self.config.print_every == 0
            or self.run.iteration % STOP_CHECK_EVERY_ITERS == 0
        )

    def _check(self) -> None:
        """A loss or weight that is no longer finite stops the run on every process, before
        anything is saved; the first process names the iteration. Otherwise notes whether a stop
        signal reached any process (stop_signalled)."""
        first_bad_loss, weights_finite, signalled, paused = self.watch.check(
            stop_signal() is not None, pause_asked()
        )
        if first_bad_loss is None and weights_finite:
            if paused:
                pause_together(self.config, self.device)
            newly, self.stop_signalled = signalled and not self.stop_signalled, signalled
            if newly and self.placement.is_main:
                log.info(
                    "A stop signal came: saving the run's position at iteration %d in %s; should "
                    "the save be cut short, the last complete checkpoint (%s) stays intact",
                    self.run.iteration,
                    shown(self.config.checkpoint_dir),
                    shown(self.last_saved) if self.last_saved else "none yet",
                )
            return
        report = (
            divergence_report(
                first_bad_loss, self.run.iteration, self.input.steps_per_epoch, self.config
            )
            if self.placement.is_main
            else None
        )
        stop_run(report, EXIT_STATUS[Diverged])

    def _epoch_sums(self, device_sums: torch.Tensor, images: int, bad: int) -> torch.Tensor:
        """This process's sums of the epoch so far: loss x images, correct, images, bad records.
        The first process also carries what a mid-epoch checkpoint had counted (globally)."""
        # Collectives run on this process's own device (the first of a model-parallel pair).
        sums = torch.cat(
            [
                device_sums.to(self.device),
                torch.tensor([images, bad], dtype=torch.float64, device=self.device),
            ]
        )
        if self.run.resumed_sums is not None and self.placement.is_main:
            sums += self.run.resumed_sums.to(sums)
        return sums

    def _checkpoint_due(self) -> bool:
        """Within an epoch, every --checkpoint_every_iters iterations (the epoch's end saves
        anyway)."""
        every = self.config.checkpoint_every_iters
        return (
            bool(every)
            and self.run.iteration % every == 0
            and self.run.steps_into_epoch < self.input.steps_per_epoch
        )

    def _save_mid_epoch(self, epoch_sums: torch.Tensor, seconds: float) -> None:
        """The checkpoint holds the epoch's global sums so far."""
        with process_group.waiting_for_peers("the all-reduce of the checkpoint's epoch sums"):
            dist.all_reduce(epoch_sums)
        with record_function(CHECKPOINT):
            self.last_saved = self.saver.save(self.run, epoch_sums, seconds)

    def _stop_preempted(self) -> NoReturn:
        """Every process stops together once the signalled position is saved; the first reports
        where (errors.PREEMPTED_EXIT_STATUS)."""
        report = self._preempted(self.last_saved)
        stop_run(report if self.placement.is_main else None, PREEMPTED_EXIT_STATUS)

    def _preempted(self, saved: str | None) -> Preempted:
        run, steps = self.run, self.input.steps_per_epoch
        return Preempted(
            f"stopped by {stop_signal_name()} at iteration {run.iteration} (epoch "
            f"{run.epochs_done + 1}, step {run.steps_into_epoch} of {steps}), saved in "
            f"{shown(saved) if saved else 'no checkpoint'}: "
            "restart with the same flags and --auto_resume to go on from there"
        )

    def _stop_waiting(
        self, stuck: StopWhileWaiting, epoch_sums: torch.Tensor, seconds: float
    ) -> NoReturn:
        """A stop signal came while this process waited for a batch that did not come (an input
        process stopped or stuck). At an epoch's start that this run saved, the position is
        saved. Else, alone, it saves the position after its last step, as at a check. With peers
        it cannot: they are in the next step's collectives, which it never joins, past where a
        position can be agreed (that step's forward has moved their BatchNorm statistics); it
        stops the run alone, in one line, and the last checkpoint stays."""
        run, config = self.run, self.config
        if not run.steps_into_epoch and self.rows:  # every process saved that epoch's end
            raise self._preempted(self._epoch_checkpoint())
        if self.placement.world_size > 1 or run.iteration == 0:
            why = "no step was done yet"
            if run.iteration:
                why = "its peers had begun the next step, past where a position can be agreed"
            raise Preempted(
                f"stopped by {stop_signal_name()} while rank {self.placement.rank} "
                f"waited {stuck.waited_s:g} s for a batch from its input (DataLoader) processes "
                f"(one is stopped or stuck, or the storage stopped answering): {why}, so "
                "nothing was saved; restart with the same flags and --auto_resume to go on "
                f"from the newest checkpoint in {shown(config.checkpoint_dir)}, if one was saved"
            )
        log.info(
            "A stop signal came, and no batch from the input (DataLoader) processes in %g s "
            "(one is stopped or stuck, or the storage stopped answering): saving the run's "
            "position at iteration %d in %s",
            stuck.waited_s,
            run.iteration,
            shown(config.checkpoint_dir),
        )
        if run.steps_into_epoch:
            self._save_mid_epoch(epoch_sums, seconds)
        else:  # an epoch's start, where a resume began
            self.last_saved = self.saver.save(run)
        self._stop_preempted()

    def _epoch_checkpoint(self) -> str:
        """The checkpoint of the last epoch's end, on every process (the saver names it on the
        first alone)."""
        config = self.config
        return checkpoint_path(config.checkpoint_dir, config.save_model_name, self.run.epochs_done)
