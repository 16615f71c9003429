"""One training process per device of this machine (GPU, or CPU worker with --use_cpu)."""

from __future__ import annotations

import logging
import os
import sys

import torch
import torch.multiprocessing as mp

from resnet50_trainer import distributed
from resnet50_trainer.config import Config
from resnet50_trainer.errors import USAGE_EXIT_STATUS, UserError
from resnet50_trainer.train import check_outputs_writable, train

log = logging.getLogger(__name__)


def launch(config: Config) -> int:
    """Start the run's processes on this machine and return the exit status of the run."""
    check_outputs_writable(config)
    store = distributed.serve_local_store(config.first_iter_timeout)
    if config.num_gpus == 1:
        run_process(0, config, store.port)
        return 0
    try:
        # spawn, not fork: CUDA cannot be used in a forked child, and spawn starts clean.
        mp.start_processes(_run_spawned, args=(config, store.port), nprocs=config.num_gpus,
                           join=True, start_method="spawn")
    except mp.ProcessExitedException as failure:
        # The failed process already printed its one-line reason (or its traceback).
        return USAGE_EXIT_STATUS if failure.exit_code == USAGE_EXIT_STATUS else 1
    except mp.ProcessRaisedException as failure:
        print(failure, file=sys.stderr)
        return 1
    return 0


def run_process(local_index: int, config: Config, store_port: int) -> None:
    """The body of one training process: placement, device, process group, training."""
    placement = distributed.placement_for(config, local_index)
    logging.basicConfig(level=logging.INFO if placement.is_main else logging.WARNING,
                        format="%(message)s", force=True)
    device = _claim_device(config, local_index)
    distributed.join_process_group(config, placement, store_port)
    try:
        train(config, placement, device)
    finally:
        distributed.leave_process_group()


def _run_spawned(local_index: int, config: Config, store_port: int) -> None:
    """A spawned process reports a user error in one line and exits 2; the launcher passes that on."""
    try:
        run_process(local_index, config, store_port)
    except UserError as error:
        print(f"resnet50-trainer: error: {error}", file=sys.stderr)
        sys.exit(USAGE_EXIT_STATUS)


def _claim_device(config: Config, local_index: int) -> torch.device:
    torch.manual_seed(config.seed)
    if config.use_cpu:
        # Processes share the cores; more threads than a share only contend.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.num_gpus))
        return torch.device("cpu")
    # PyTorch has no workspace cap of its own (its Conv_v8.cpp only bounds plans by the allocator's
    # largest free block); cuDNN reads this debug variable, in MiB. Set before cuDNN is first used.
    os.environ.setdefault("CUDNN_CONV_WSCAP_DBG", str(config.cudnn_workspace_limit_mb))
    torch.backends.cudnn.benchmark = True  # fixed input shapes: pick the fastest kernels once
    device = torch.device("cuda", config.gpus[local_index])
    torch.cuda.set_device(device)
    return device
