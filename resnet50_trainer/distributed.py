"""Where this process stands in the run, and the process group that joins it to its peers.

A single machine meets through a TCPStore that the launching process serves on a free port,
so it needs no outside service.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch.distributed as dist

from resnet50_trainer.config import Config
from resnet50_trainer.errors import UserError

LOCALHOST = "127.0.0.1"


@dataclass(frozen=True)
class Placement:
    """This process's rank in the run, read once."""

    rank: int
    world_size: int
    local_rank: int  # index among this machine's training processes
    local_world_size: int

    @property
    def is_main(self) -> bool:
        """The one process that writes the run log, checkpoints and the progress bar."""
        return self.rank == 0


def placement_for(config: Config, local_index: int) -> Placement:
    return Placement(
        rank=config.shard_id * config.num_gpus + local_index,
        world_size=config.world_size,
        local_rank=local_index,
        local_world_size=config.num_gpus,
    )


def serve_local_store(timeout_s: float) -> dist.TCPStore:
    """The meeting point of this machine's processes; port 0 lets the OS pick a free port."""
    return dist.TCPStore(LOCALHOST, 0, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def join_process_group(config: Config, placement: Placement, store_port: int) -> None:
    """Join the run's process group: NCCL on GPUs, Gloo on CPUs."""
    first = datetime.timedelta(seconds=config.first_iter_timeout)
    try:
        store = dist.TCPStore(LOCALHOST, store_port, is_master=False, timeout=first)
    except (RuntimeError, TimeoutError) as error:
        raise UserError(f"could not reach this machine's rendezvous at {LOCALHOST}:{store_port} "
                        f"({error}); check that the launching process is alive") from error
    backend = "gloo" if config.use_cpu else "nccl"
    dist.init_process_group(backend, store=store, rank=placement.rank,
                            world_size=placement.world_size, timeout=first)


def shorten_timeout(config: Config) -> None:
    """After the first step, a peer that stops answering ends the run within --timeout."""
    timeout = datetime.timedelta(seconds=config.timeout)
    set_timeout = getattr(dist, "set_timeout", None)  # torch >= 2.12; earlier: the private setter
    if set_timeout is None:
        from torch.distributed.distributed_c10d import _set_pg_timeout as set_timeout
    set_timeout(timeout)


def leave_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()

