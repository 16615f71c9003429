"""The GPU ids this machine trains on, chosen from the flags without importing torch: the command
line refuses a bad choice before the seconds torch's import takes."""

from __future__ import annotations

from collections.abc import Sequence

from resnet50_trainer.config.values import ALL_GPUS
from resnet50_trainer.errors import UserError


def select_gpus(
    gpus: Sequence[int] | None,
    num_gpus: int | None,
    use_cpu: bool,
    model_parallel: bool,
    gpus_present: int,
) -> list[int]:
    """The GPU ids this machine trains on: --gpus as listed (or all of them), else the first
    --num_gpus replicas' worth (two GPUs a replica with --model_parallel); none with --use_cpu."""
    per_replica = 2 if model_parallel else 1
    if use_cpu:
        if gpus:
            raise UserError("--gpus names GPUs but --use_cpu trains on the CPU: drop one of them")
        return []
    if gpus:
        # As listed (a GPU twice: two processes share it, values.gpu_list); or every GPU here.
        ids = list(range(gpus_present)) if tuple(gpus) == ALL_GPUS else list(gpus)
        if not ids:
            raise UserError(
                "--gpus all: no GPU found on this machine; add --use_cpu to train on the CPU"
            )
        if num_gpus is not None and num_gpus * per_replica != len(ids):
            raise UserError(
                f"--gpus lists {len(ids)} GPUs but --num_gpus says {num_gpus}"
                f"{' replicas of 2 GPUs' if model_parallel else ''}: "
                "give one of the two"
            )
        if model_parallel:
            gpu_pairs(ids)  # refuses an odd count
    else:
        ids = list(range((num_gpus or 1) * per_replica))
    if gpus_present == 0:
        raise UserError("no GPU found on this machine: add --use_cpu to train on the CPU")
    if max(ids) >= gpus_present:
        needs = (
            f"--model_parallel puts each replica on 2 GPUs, so {len(ids)} GPUs are needed"
            if model_parallel
            else f"GPU {max(ids)} asked for"
        )
        raise UserError(
            f"{needs} but this machine has {gpus_present} "
            f"(ids 0 to {gpus_present - 1}): ask for fewer"
        )
    return ids


def gpu_pairs(gpu_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Pair the GPUs for --model_parallel: (0,1), (2,3), ... one pair per model replica."""
    if len(gpu_ids) < 2 or len(gpu_ids) % 2:
        listed = ",".join(str(gpu) for gpu in gpu_ids) or "none"
        raise UserError(
            f"--model_parallel splits each replica over 2 GPUs, so it needs an even number of GPUs "
            f"(got {len(gpu_ids)}: {listed}); list GPUs in pairs, "
            "e.g. --gpus 0,1 or --gpus 0,1,2,3"
        )
    return list(zip(gpu_ids[0::2], gpu_ids[1::2]))
