"""Which devices this machine trains on, and which of them each training process claims.

One training process per model replica: a GPU each, or a pair of GPUs each with --model_parallel
(the replica split over the pair), or a share of the CPU with --use_cpu.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch

from resnet50_trainer.config.cores import cores_per_process
from resnet50_trainer.config.gpu_ids import gpu_pairs
from resnet50_trainer.config.launchers import sees_only_its_own_gpus
from resnet50_trainer.config.settings import Config


def gpus_on_this_machine() -> int:
    return torch.cuda.device_count()


def claim_device(config: Config, local_index: int) -> torch.device:
    """This process's device, set up: its share of the CPU's threads, or its GPU with cuDNN's
    choices; with --model_parallel, the first GPU of its pair (where the input goes)."""
    if config.use_cpu:
        # Processes share the cores; more threads than a share only contend.
        torch.set_num_threads(cores_per_process(config.processes_per_machine))
        return torch.device("cpu")
    if config.cudnn_workspace_limit_mb is not None:
        # PyTorch has no workspace cap of its own (its Conv_v8.cpp only bounds plans by the
        # allocator's largest free block); cuDNN reads this debug variable, in MiB. Set before
        # cuDNN is first used; none by default, so the autotuner may pick any algorithm.
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
    per_replica = 2 if config.model_parallel else 1
    # srun --gpus-per-task: this rank's own GPU(s) are the ones it sees, numbered from 0.
    visible = gpus_on_this_machine()
    if sees_only_its_own_gpus(config.processes_per_machine, per_replica, visible, os.environ):
        return torch.device("cuda", 0), torch.device("cuda", per_replica - 1)
    if config.model_parallel:
        return model_parallel_devices(config.gpus)[local_index]
    device = torch.device("cuda", config.gpus[local_index])
    return device, device


def model_parallel_devices(gpu_ids: Sequence[int]) -> list[tuple[torch.device, torch.device]]:
    """The device pairs of --model_parallel's replicas: (cuda:0, cuda:1), (cuda:2, cuda:3), ..."""
    return [
        (torch.device("cuda", first), torch.device("cuda", second))
        for first, second in gpu_pairs(gpu_ids)
    ]
