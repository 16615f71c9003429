"""Where this process stands in the run, and the process group that joins it to its peers.

Three ways to meet:
- one machine, our own launcher: a TCPStore that the launching process serves on a free port;
- several machines (shards), our own launcher: the launching process of each shard meets the others
  through Redis or a shared directory (rendezvous/), and its processes join the store found there;
- torchrun, srun or mpirun started us: each process meets at MASTER_ADDR:MASTER_PORT when the
  launcher gives one (env://), else through Redis or a shared directory like shards, one rank each.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from resnet50_trainer import network, rendezvous
from resnet50_trainer.config import Config
from resnet50_trainer.errors import UserError
from resnet50_trainer.rendezvous.launchers import Launched
from resnet50_trainer.rendezvous.meeting import Meeting, Seat, meet

log = logging.getLogger(__name__)
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
    """Global rank = shard_id x processes per shard + local index (cli.py derives the shard from a
    launcher's rank when one started us)."""
    return Placement(
        rank=config.shard_id * config.num_gpus + local_index,
        world_size=config.world_size,
        local_rank=local_index,
        local_world_size=config.num_gpus,
    )


def meet_shards(config: Config) -> Meeting:
    """The launching process's meeting: a local store for one shard, else the shards' rendezvous.
    Keep the result for the whole run: shard 0's launching process serves the run's store."""
    if config.num_shards == 1:
        store = dist.TCPStore(LOCALHOST, 0, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=config.first_iter_timeout))
        return Meeting(store, LOCALHOST, store.port)
    return _meet_through_board(config, Seat(config.shard_id, config.num_shards, "shard", config.run_id))


def join_process_group(config: Config, placement: Placement, host: str, port: int) -> None:
    """Join the run's process group through the store at host:port: NCCL on GPUs, Gloo on CPUs."""
    first = datetime.timedelta(seconds=config.first_iter_timeout)
    try:
        store = dist.TCPStore(host, port, is_master=False, timeout=first)
    except (RuntimeError, TimeoutError) as error:
        raise UserError(f"could not reach the run's store at {host}:{port} ({error}); check that "
                        "shard 0's launching process is alive") from error
    dist.init_process_group(_backend(config), store=store, rank=placement.rank,
                            world_size=placement.world_size, timeout=first)


def join_under_launcher(config: Config, launched: Launched) -> Optional[Meeting]:
    """torchrun/srun/mpirun: this process is one rank. Returns the meeting to keep, if any."""
    first = datetime.timedelta(seconds=config.first_iter_timeout)
    if launched.master is not None:
        dist.init_process_group(_backend(config), init_method="env://", rank=launched.rank,
                                world_size=launched.world_size, timeout=first)
        return None
    meeting = _meet_through_board(config, Seat(launched.rank, launched.world_size, "rank", config.run_id))
    dist.init_process_group(_backend(config), store=meeting.store, rank=launched.rank,
                            world_size=launched.world_size, timeout=first)
    return meeting


def _meet_through_board(config: Config, seat: Seat) -> Meeting:
    board = rendezvous.open_board(config.run_id, config.redis_host, config.redis_port,
                                  config.redis_password, config.file_store_path)
    host = network.advertised_host(config.distributed_interfaces, config.distributed_transport,
                                   config.redis_host)
    log.info("%s %d of %d: meeting the others of run %s via %s", seat.noun.capitalize(), seat.index,
             seat.count, seat.run_id, board.where)
    return meet(board, seat, host, config.first_iter_timeout)


def _backend(config: Config) -> str:
    return "gloo" if config.use_cpu else "nccl"


def shorten_timeout(config: Config) -> None:
    """After the first step, a peer that stops answering ends the run within --timeout."""
    timeout = datetime.timedelta(seconds=config.timeout)
    set_timeout = getattr(dist, "set_timeout", None)  # torch >= 2.12; earlier: the private setter
    if set_timeout is None:
        from torch.distributed.distributed_c10d import _set_pg_timeout as set_timeout
    set_timeout(timeout)


def parameters_digest_everywhere(module: torch.nn.Module) -> str:
    """SHA-256 of this replica's parameters, checked equal on every process; raises if any differs.

    DDP keeps replicas identical by construction; this proves it at the end of a run for the cost
    of one hash and one small all-gather."""
    digest = hashlib.sha256()
    for parameter in module.parameters():
        digest.update(parameter.detach().cpu().contiguous().numpy().tobytes())
    mine = torch.tensor(list(digest.digest()[:16]), dtype=torch.uint8,
                        device=next(module.parameters()).device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    differing = [rank for rank, other in enumerate(everyone) if not torch.equal(other, mine)]
    if differing:
        raise RuntimeError(f"replicas diverged: ranks {differing} hold other parameters than "
                           f"rank {dist.get_rank()}")
    return digest.hexdigest()


def leave_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
