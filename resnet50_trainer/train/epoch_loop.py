"""The epoch loop: steps, the divergence checks, mid-epoch checkpoints and, after each epoch, the
bad-record verdict, the epoch's checkpoint, the evaluation and the log row. The only code that
advances the run's state (checkpoint/run_state.py); the policies it applies return verdicts, and
it stops the run with them (distributed/stopping.py)."""

from __future__ import annotations

import logging
import time
from typing import NoReturn

import torch
import torch.distributed as dist
from torch.profiler import record_function

from resnet50_trainer.checkpoint.run_state import RunState
from resnet50_trainer.checkpoint.saver import CheckpointSaver
from resnet50_trainer.config.settings import Config
from resnet50_trainer.data.batch import TrainingLabelOutside
from resnet50_trainer.data.prefetch import StopWhileWaiting
from resnet50_trainer.data.spans import CHECKPOINT, EVALUATION
from resnet50_trainer.distributed import process_group
from resnet50_trainer.distributed.pausing import pause_asked, pause_together
from resnet50_trainer.distributed.preemption import stop_signal
from resnet50_trainer.distributed.stopping import stop_run, stop_together
from resnet50_trainer.errors import EXIT_STATUS, PREEMPTED_EXIT_STATUS, Diverged, exit_status
from resnet50_trainer.model.optim import set_learning_rate
from resnet50_trainer.model.replica import Learner
from resnet50_trainer.path_words import shown
from resnet50_trainer.reporting.progress import EpochProgress
from resnet50_trainer.reporting.runlog import EpochRow
from resnet50_trainer.train.bad_records import bad_records_verdict
from resnet50_trainer.train.batch_mixing import BatchMixing
from resnet50_trainer.train.divergence import DivergenceWatch, divergence_report
from resnet50_trainer.train.epoch_report import (
    EpochResult,
    EpochTotals,
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
from resnet50_trainer.train.outputs import Outputs
from resnet50_trainer.train.step import forward_backward
from resnet50_trainer.train.stop_lines import epoch_checkpoint, preempted, unsaved_while_waiting

log = logging.getLogger(__name__)
# Every process learns of a stop signal in the divergence check's all-reduce (read every
# --print_every steps anyway), run at least this often too: a signalled run stops within this
# many steps (seconds on a GPU, inside Slurm's and Kubernetes' 30 s grace) at the same step
# everywhere. A read each step would stall a GPU's queue every step; one in 20, once in 20.
STOP_CHECK_EVERY_ITERS = 20


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

    def train_remaining_epochs(self) -> None:
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
                    checkpoint = epoch_checkpoint(config, run)
                    raise preempted(run, self.input.steps_per_epoch, checkpoint) from None
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
        totals = EpochTotals(self.replica.output_device)
        progress = EpochProgress(
            config,
            self.placement.is_main,
            run.epochs_done,
            steps,
            run.steps_into_epoch,
            self.outputs.gpu_monitor,
        )
        started = time.perf_counter() - run.resumed_seconds
        try:
            for batch in progress.batches(self.input.batches):
                loss, correct, labels = self._train_step(batch)
                if not self.timeout_shortened:  # after the first step a silent peer ends it sooner
                    process_group.shorten_timeout(config)
                    self.timeout_shortened = True
                self.outputs.profile_step()
                totals.add(loss, correct, len(labels), batch.bad_keys)
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
                self._after_step(totals, started)
        except TrainingLabelOutside as outside:
            raise refuse_training_label(config, outside.key, outside.label) from None
        except StopWhileWaiting as stuck:
            self._stop_waiting(stuck, self._epoch_sums(totals), time.perf_counter() - started)
        finally:
            progress.close()
        self._check()
        sums = self._epoch_sums(totals)
        with process_group.waiting_for_peers("the all-reduce of the epoch's totals"):
            dist.all_reduce(sums)
            loss_sum, correct, images, bad = sums.tolist()  # the last step, peers too
        seconds = time.perf_counter() - started
        return EpochResult(
            loss_sum / images, correct / images, int(images), seconds, int(bad), totals.bad_keys
        )

    def _after_step(self, totals: EpochTotals, started: float) -> None:
        """What follows a step, in the order that keeps the run sound: the check of the loss and
        weights (which also agrees on stop signals) where a checkpoint is due or the loop reads the
        device anyway, before any save, so that no weights that are no longer finite are saved;
        then the save, where due or where a stop was agreed; then the stop, its position saved."""
        mid_epoch = self.run.steps_into_epoch < self.input.steps_per_epoch
        checkpoint_due = self._checkpoint_due()
        if checkpoint_due or self._check_due():
            self._check()
        if checkpoint_due or (self.stop_signalled and mid_epoch):
            self._save_mid_epoch(self._epoch_sums(totals), time.perf_counter() - started)
        if self.stop_signalled and mid_epoch:
            self._stop_preempted()

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

    def _epoch_sums(self, totals: EpochTotals) -> torch.Tensor:
        """This process's sums of the epoch so far, on its own device, where collectives run (the
        first of a model-parallel pair). The first process also carries what a mid-epoch
        checkpoint had counted (globally)."""
        sums = totals.sums(self.device)
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
        report = preempted(self.run, self.input.steps_per_epoch, self.last_saved)
        stop_run(report if self.placement.is_main else None, PREEMPTED_EXIT_STATUS)

    def _stop_waiting(
        self, stuck: StopWhileWaiting, epoch_sums: torch.Tensor, seconds: float
    ) -> NoReturn:
        """A stop signal came while this process waited for a batch that did not come (an input
        process stopped or stuck). At an epoch's start that this run saved, the position is
        saved. Else, alone, it saves the position after its last step, as at a check; with peers
        it cannot (stop_lines.unsaved_while_waiting), and the last checkpoint stays."""
        run, config = self.run, self.config
        if not run.steps_into_epoch and self.rows:  # every process saved that epoch's end
            raise preempted(run, self.input.steps_per_epoch, epoch_checkpoint(config, run))
        unsaved = unsaved_while_waiting(stuck, self.placement, run, config)
        if unsaved:
            raise unsaved
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
