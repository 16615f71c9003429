"""--test_only: a checkpoint's test accuracy on the whole test DB, scored by every process with
the evaluation that follows each training epoch; nothing is trained and nothing is written. A
stop signal (a scheduler's preemption) ends it before its next batch, exit 3 as a preempted
training run: with no position to save there is nothing to wait for."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

import torch

from resnet50_trainer.checkpoint import files as checkpoint_files
from resnet50_trainer.checkpoint import schema
from resnet50_trainer.checkpoint.claim import check_checkpoint
from resnet50_trainer.config.settings import Config
from resnet50_trainer.data.prefetch import StopWhileWaiting
from resnet50_trainer.distributed.preemption import stop_signal, stop_signal_name
from resnet50_trainer.distributed.process_group import Placement
from resnet50_trainer.distributed.stopping import on_first_process
from resnet50_trainer.errors import Preempted, UserError
from resnet50_trainer.model.replica import build_replica
from resnet50_trainer.train.evaluation import evaluate, refuse_labels_outside
from resnet50_trainer.train.inputs import build_test_input

log = logging.getLogger(__name__)


def evaluate_checkpoint(config: Config, placement: Placement, device: torch.device) -> None:
    """The first process reads the checkpoint (a directory: its newest usable one, as a resume
    takes it); DDP's broadcast gives the others its weights, so all score the same model even
    while a training run adds checkpoints to that directory."""
    state = on_first_process(
        lambda: _read_checkpoint(config),
        placement,
        device,
        "the first process's reading of the weights",
    )
    prefetcher = build_test_input(config, placement, device)
    test_batches = None if prefetcher is None else _until_a_stop_signal(prefetcher, config)
    weights = None
    if state is not None:  # --ema_for_test: the checkpoint's average of the weights
        weights = schema.ema_weights(state) if config.ema_for_test else state["model"]
    replica = build_replica(config, placement.local_rank, device, weights)
    score = evaluate(replica, test_batches, device, placement.is_main)
    refuse_labels_outside(score, config, placement.is_main)
    if state is None or score is None:  # not the first process; score is None only without a DB
        return
    log.info(
        "Test accuracy %.6f of %s%s (%d epochs%s done): %d records of --test_data %s scored, "
        "top-5 accuracy %.6f%s",
        score.top1,
        state["path"],
        "'s EMA" if config.ema_for_test else "",
        state["epoch"],
        f" and {state['step']} steps" if state["step"] else "",
        score.images,
        config.test_data,
        score.top5,
        f" (unreadable records left out: {score.bad_records})" if score.bad_records else "",
    )


def _until_a_stop_signal(batches: Iterable, config: Config) -> Iterator:
    """The batches, until this process has received a stop signal: then Preempted, at the next
    batch, or as it waits for one that does not come (prefetch.py's StopWhileWaiting). Each
    process stops on its own signal (a scheduler signals them all); one left scoring finds its
    peers gone at the all-reduce of the counts and says so."""
    try:
        for batch in batches:
            if stop_signal() is not None:
                break
            yield batch
        else:
            return
    except StopWhileWaiting:
        pass
    raise Preempted(
        f"stopped by {stop_signal_name()} before the evaluation of "
        f"{config.load_model_path} ended: nothing was written; run the same command again to "
        "score it"
    )


def _read_checkpoint(config: Config) -> dict:
    assert (
        config.load_model_path is not None
    )  # flags/outputs.check_outputs: --test_only requires it
    state = checkpoint_files.load_checkpoint(config.load_model_path, config.save_model_name)
    check_checkpoint(state, config)
    if config.ema_for_test and not state.get("ema"):
        raise UserError(
            f"--ema_for_test scores a checkpoint's EMA of the weights, and {state['path']} "
            "holds none (its run had no --ema_decay): leave --ema_for_test out"
        )
    return state
