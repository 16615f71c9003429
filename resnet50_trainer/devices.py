"""Which devices this machine trains on, and which of them each training process claims.

One training process per model replica: a GPU each, or a pair of GPUs each with --model_parallel
(the replica split over the pair), or a share of the CPU with --use_cpu.
"""

from __future__ import annotations

import os
from typing import Optional

import torch

from resnet50_trainer.config import Config
from resnet50_trainer.errors import UserError
from resnet50_trainer.model import model_parallel_devices


def gpus_on_this_machine() -> int:
    return torch.cuda.device_count()


def select_gpus(gpus: Optional[str], num_gpus: Optional[int], use_cpu: bool, model_parallel: bool,
                gpus_present: int) -> list[int]:
    """The GPU ids this machine trains on: --gpus as listed, else the first --num_gpus replicas'
    worth (two GPUs a replica with --model_parallel); none with --use_cpu."""
    per_replica = 2 if model_parallel else 1
    if use_cpu:
        if gpus:
            raise UserError("--gpus names GPUs but --use_cpu trains on the CPU: drop one of them")
        return []
    if gpus:
        try:
            ids = [int(part) for part in gpus.split(",")]
        except ValueError:
            raise UserError(f"--gpus {gpus!r} is not a comma-separated list of GPU ids, "
                            "e.g. --gpus 0,1") from None
        if len(set(ids)) != len(ids) or min(ids) < 0:
            raise UserError(f"--gpus {gpus} repeats an id or has a negative one: list each GPU once")
        if num_gpus is not None and num_gpus * per_replica != len(ids):
            raise UserError(f"--gpus lists {len(ids)} GPUs but --num_gpus says {num_gpus}"
                            f"{' replicas of 2 GPUs' if model_parallel else ''}: give one of the two")
        if model_parallel:
            model_parallel_devices(ids)  # refuses an odd count
    else:
        ids = list(range((num_gpus or 1) * per_replica))
    if gpus_present == 0:
        raise UserError("no GPU found on this machine: add --use_cpu to train on the CPU")
    if max(ids) >= gpus_present:
        needs = (f"--model_parallel puts each replica on 2 GPUs, so {len(ids)} GPUs are needed"
                 if model_parallel else f"GPU {max(ids)} asked for")
        raise UserError(f"{needs} but this machine has {gpus_present} (ids 0 to {gpus_present - 1}): "
                        "ask for fewer")
    return ids


def claim_device(config: Config, local_index: int) -> torch.device:
    """Set this process up on its device; with --model_parallel, the first of its pair (where the
    input goes)."""
    torch.manual_seed(config.seed)
    if config.use_cpu:
        # Processes share the cores; more threads than a share only contend.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // config.num_gpus))
        return torch.device("cpu")
    # PyTorch has no workspace cap of its own (its Conv_v8.cpp only bounds plans by the allocator's
    # largest free block); cuDNN reads this debug variable, in MiB. Set before cuDNN is first used.
    os.environ.setdefault("CUDNN_CONV_WSCAP_DBG", str(config.cudnn_workspace_limit_mb))
    torch.backends.cudnn.benchmark = True  # fixed input shapes: pick the fastest kernels once
    device = replica_devices(config, local_index)[0]
    torch.cuda.set_device(device)
    return device


def replica_devices(config: Config, local_index: int) -> tuple[torch.device, torch.device]:
    """The two devices of this process's model-parallel replica (both the CPU with --use_cpu, so
    the split, the hand-over and DDP over the composite module run on any machine)."""
    if config.use_cpu:
        return torch.device("cpu"), torch.device("cpu")
    if config.model_parallel:
        return model_parallel_devices(config.gpus)[local_index]
    device = torch.device("cuda", config.gpus[local_index])
    return device, device
