"""One training process per device of this machine (GPU, or CPU worker with --use_cpu), or none of
our own when torchrun, srun or mpirun started this process as one rank."""

from __future__ import annotations

import logging
import os
import sys
from typing import Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from resnet50_trainer import distributed, network
from resnet50_trainer.config import Config
from resnet50_trainer.errors import USAGE_EXIT_STATUS, UserError
from resnet50_trainer.rendezvous.launchers import Launched
from resnet50_trainer.train import check_outputs_writable, train

log = logging.getLogger(__name__)
PEER_LOST_EXIT_STATUS = 1


def launch(config: Config, launched: Optional[Launched] = None) -> int:
    """Start the run's processes on this machine and return the exit status of the run."""
    check_outputs_writable(config)
    network.configure_transport(config.distributed_transport, config.distributed_interfaces)
    if launched is not None:
        _run_launched(launched, config)
        return 0
    # Held until the run ends: in shard 0 this process serves the run's store.
    meeting = distributed.meet_shards(config)
    if config.num_gpus == 1:
        run_process(0, config, meeting.host, meeting.port)
        return 0
    try:
        # spawn, not fork: CUDA cannot be used in a forked child, and spawn starts clean.
        mp.start_processes(_run_spawned, args=(config, meeting.host, meeting.port),
                           nprocs=config.num_gpus, join=True, start_method="spawn")
    except mp.ProcessExitedException as failure:
        # The failed process already printed its one-line reason (or its traceback).
        return USAGE_EXIT_STATUS if failure.exit_code == USAGE_EXIT_STATUS else 1
    except mp.ProcessRaisedException as failure:
        print(failure, file=sys.stderr)
        return 1
    return 0


def run_process(local_index: int, config: Config, store_host: str, store_port: int) -> None:
    """The body of one training process: placement, device, process group, training."""
    placement = distributed.placement_for(config, local_index)
    _set_up_logging(placement)
    device = _claim_device(config, local_index)
    distributed.join_process_group(config, placement, store_host, store_port)
    _train_in_group(config, placement, device)


def _run_launched(launched: Launched, config: Config) -> None:
    """One rank started by torchrun/srun/mpirun: the launcher's placement, device LOCAL_RANK."""
    placement = distributed.Placement(launched.rank, launched.world_size, launched.local_rank,
                                      launched.local_world_size)
    _set_up_logging(placement)
    device = _claim_device(config, launched.local_rank)
    meeting = distributed.join_under_launcher(config, launched)  # noqa: F841 (held for the run)
    _train_in_group(config, placement, device)


def _train_in_group(config: Config, placement: distributed.Placement, device: torch.device) -> None:
    try:
        train(config, placement, device)
    except RuntimeError as error:
        if not _is_peer_loss(error):
            raise
        # A peer died or stopped answering; its own process names its reason, if it could.
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:300]
        print(f"resnet50-trainer: error: rank {placement.rank} lost contact with the run's other "
              f"processes ({reason}); every process stops", file=sys.stderr)
        sys.exit(PEER_LOST_EXIT_STATUS)
    finally:
        distributed.leave_process_group()


def _is_peer_loss(error: RuntimeError) -> bool:
    """Collectives raise DistError; inside DDP's backward the same failure arrives as a plain
    RuntimeError carrying Gloo's or NCCL's message."""
    return isinstance(error, dist.DistError) or any(
        marker in str(error) for marker in ("gloo", "NCCL", "Connection closed by peer", "timed out"))


def _set_up_logging(placement: distributed.Placement) -> None:
    logging.basicConfig(level=logging.INFO if placement.is_main else logging.WARNING,
                        format="%(message)s", force=True)


def _run_spawned(local_index: int, config: Config, store_host: str, store_port: int) -> None:
    """A spawned process reports a user error in one line and exits 2; the launcher passes that on."""
    try:
        run_process(local_index, config, store_host, store_port)
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
