"""What one training process does of the run: builds its parts, resumes, trains the epochs left,
summarises, and decides how the process ends when the run stops early."""

from __future__ import annotations

import logging
import time

import torch
from tqdm.contrib.logging import logging_redirect_tqdm

from resnet50_trainer.checkpoint import schema
from resnet50_trainer.checkpoint.auto_resume import resume_path, say_how_it_starts
from resnet50_trainer.checkpoint.initial_weights import read_init_model
from resnet50_trainer.checkpoint.resume import resume
from resnet50_trainer.checkpoint.run_state import RunState
from resnet50_trainer.checkpoint.saver import CheckpointSaver
from resnet50_trainer.config.settings import Config
from resnet50_trainer.data.settings import RANDOM_ORDER, ReadOrder, describe_order
from resnet50_trainer.distributed import process_group
from resnet50_trainer.distributed.process_group import Placement
from resnet50_trainer.distributed.stopping import (
    StoppedByFirst,
    on_first_process,
    wait_for_first_process_to_exit,
)
from resnet50_trainer.lifecycle import stop_watching_input_processes
from resnet50_trainer.model.lr_schedule import LearningRateSchedule
from resnet50_trainer.model.precision import describe_precision
from resnet50_trainer.model.replica import Learner, build_replica
from resnet50_trainer.path_words import shown
from resnet50_trainer.train.epoch_loop import EpochLoop
from resnet50_trainer.train.evaluate_only import evaluate_checkpoint
from resnet50_trainer.train.inputs import build_test_input, build_train_input, input_settings
from resnet50_trainer.train.outputs import Outputs

log = logging.getLogger(__name__)


def train(config: Config, placement: Placement, device: torch.device) -> None:
    """The whole run on this process. A stop that every process reaches together (a failed
    write, diverged weights, too many bad records): the first process raises the failure, which
    its launcher reports in one line; the others exit here with its status once it has gone."""
    try:
        _set_up_and_train(config, placement, device)
    except StoppedByFirst as stop:
        wait_for_first_process_to_exit()
        raise SystemExit(stop.status) from None


def _set_up_and_train(config: Config, placement: Placement, device: torch.device) -> None:
    """The parts built, the resume, the epochs left trained, the summary; --test_only scores."""
    if config.test_only:
        evaluate_checkpoint(config, placement, device)
        stop_watching_input_processes()  # as once the epochs are done, below
        return
    started = time.time()
    train_input = build_train_input(config, placement, device)
    test_batches = build_test_input(config, placement, device)
    init_model = config.init_model
    initial_weights = (
        on_first_process(
            lambda: read_init_model(init_model, config),
            placement,
            device,
            "the first process's reading of the weights",
        )
        if init_model
        else None
    )
    replica = build_replica(config, placement.local_rank, device, initial_weights)
    schedule = LearningRateSchedule.of(config, train_input.steps_per_epoch)
    run, lineage = RunState(), schema.new_lineage()
    if config.load_model_path or config.auto_resume:
        if placement.is_main:
            say_how_it_starts(config)
        run, lineage = resume(
            resume_path(config),
            config,
            placement,
            replica,
            schedule,
            train_input.steps_per_epoch,
        )
    if run.steps_into_epoch and train_input.epoch_plan.finish_epoch_in(
        run.epochs_done, *run.read_order
    ):
        log.info(
            "Epoch %d goes on in the order it began in (%s); the epochs after it read in %s",
            run.epochs_done + 1,
            describe_order(*run.read_order),
            describe_order(*train_input.order.shape) if train_input.order else RANDOM_ORDER,
        )
    if run.epochs_done >= config.num_epochs:
        log.info("Nothing to train: the checkpoint has completed all %d epochs", config.num_epochs)
        return
    steps_left = schedule.iterations_per_epoch * config.num_epochs - run.iteration
    outputs = Outputs.open(config, placement, device, started, lineage, run.iteration, steps_left)
    learner = Learner(placement, device, replica, schedule)
    _log_start(config, placement, learner, outputs, train_input.order)
    saver = CheckpointSaver(config, learner, lineage)
    loop = EpochLoop(config, learner, train_input, test_batches, run, saver, outputs)
    with logging_redirect_tqdm():
        loop.train_remaining_epochs()
    # No batch is wanted now: an input process that dies from here on (its loader's shutdown
    # included) must not raise (lifecycle.py).
    stop_watching_input_processes()
    outputs.close()
    digest = process_group.parameters_digest_everywhere(replica.model)
    if outputs.runlog:
        _summarise(loop, outputs.runlog.path, time.time() - started)
        log.info(
            "Parameters identical on all %d processes (sha256 %s)", placement.world_size, digest
        )


def _log_start(
    config: Config,
    placement: Placement,
    learner: Learner,
    outputs: Outputs,
    order: ReadOrder | None,
) -> None:
    passes = (
        f" in {config.iter_size} passes of {config.device_batch_size // config.iter_size}"
        if config.iter_size > 1
        else ""
    )
    schedule = learner.schedule
    processes = f"{placement.world_size} process{'es' * (placement.world_size != 1)}"
    log.info(
        "ResNet-%d, %s x %d images%s = global batch %d, effective LR %.5g "
        "(%s), %s, %d iteration%s per epoch; %s, %s%s%s%s",
        config.num_layers,
        processes,
        config.device_batch_size,
        passes,
        config.global_batch_size,
        config.effective_learning_rate,
        config.learning_rate_origin,
        schedule.describe(),
        schedule.iterations_per_epoch,
        "s" * (schedule.iterations_per_epoch != 1),
        describe_precision(learner.replica.precision.settings, learner.device),
        "synthetic batches (--train_data null)"
        if config.synthetic
        else input_settings(config, train=True).describe_decoding(config.processes_per_machine),
        f"; log {shown(outputs.runlog.path)}" if outputs.runlog else "",
        f"; TensorBoard {shown(outputs.tensorboard.directory)}" if outputs.tensorboard else "",
        f"; read order {describe_order(*order.shape)} ({order.why})" if order else "",
    )


def _summarise(loop: EpochLoop, log_path: str, seconds: float) -> None:
    rows = loop.rows
    mean_rate = sum(row.inputs_per_sec for row in rows) / len(rows)
    best = max(rows, key=lambda row: row.test_accuracy)
    log.info(
        "Done in %.1f s: %.1f images/sec on average per epoch; best test accuracy %s; log %s; "
        "checkpoint %s",
        seconds,
        mean_rate,
        (
            f"{best.test_accuracy:.4f} (epoch {best.epoch}, top-5 {best.top5_test_accuracy:.4f})"
            if best.test_accuracy >= 0
            else "n/a"
        ),
        shown(log_path),
        shown(loop.last_saved) if loop.last_saved else None,
    )
