"""Where this process stands in the run (Placement), how long it waits on its peers and what a
failed wait means, the parameters' digest every process compares, and leaving the group; how it
meets them and joins the group is joining.py's."""

from __future__ import annotations

import datetime
import hashlib
import logging
import multiprocessing
import os
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.utils.data

from resnet50_trainer.config.settings import Config
from resnet50_trainer.distributed import heartbeats
from resnet50_trainer.distributed.rendezvous.meeting import first_line
from resnet50_trainer.errors import PeerLost

log = logging.getLogger(__name__)
_DATALOADER_CODE = os.path.dirname(torch.utils.data.__file__) + os.sep
_MULTIPROCESSING_CODE = os.path.dirname(multiprocessing.__file__) + os.sep


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
    """This process's place in a run our own launcher started: global rank = shard_id x processes
    per shard + local index. (Under torchrun, srun or mpirun the launcher's ranks are used.)"""
    return Placement(
        rank=config.shard_id * config.processes_per_machine + local_index,
        world_size=config.world_size,
        local_rank=local_index,
        local_world_size=config.processes_per_machine,
    )


# The limit of this process's collectives once shortened (shorten_timeout); None until then, when
# the group's own (--first_iter_timeout) holds.
_short_timeout: list[datetime.timedelta] = []


def shorten_timeout(config: Config) -> None:
    """After the first step, a peer that stops answering ends the run within --timeout."""
    _short_timeout[:] = [datetime.timedelta(seconds=config.timeout)]
    _set_timeout(_short_timeout[0])


@contextmanager
def long_wait(config: Config, limit_s: float | None = None) -> Iterator[None]:
    """Collectives issued inside wait up to `limit_s`, --first_iter_timeout where None: the
    checkpoint barrier, where the others wait while the first process writes (hundreds of MB, on
    slow storage perhaps); a pause (distributed/pausing.py), as long as it lasts. With NCCL a
    collective past its limit is aborted by the watchdog, which kills the process (SIGABRT)."""
    group_s = datetime.timedelta(seconds=config.first_iter_timeout)
    _set_timeout(group_s if limit_s is None else datetime.timedelta(seconds=limit_s))
    try:
        yield
    finally:
        _set_timeout(_short_timeout[0] if _short_timeout else group_s)


def _set_timeout(timeout: datetime.timedelta) -> None:
    set_timeout = getattr(dist, "set_timeout", None)  # torch >= 2.12; earlier: the private setter
    if set_timeout is None:
        from torch.distributed.distributed_c10d import _set_pg_timeout

        set_timeout = _set_pg_timeout
    set_timeout(timeout)


@contextmanager
def waiting_for_peers(what: str) -> Iterator[None]:
    """Wrap each place where this process waits on its peers: a collective (or a step holding DDP's)
    that fails there is a lost peer, raised as PeerLost naming `what` ("the checkpoint barrier").

    Recognised by where it happens, not by its words: Gloo raises plain RuntimeErrors, torch's own
    collectives DistErrors. Not a peer's doing: a RuntimeError subclass (out of memory, CUDA
    errors, torch.compile's errors, ours), the DataLoader's report of a dead input process,
    which its SIGCHLD handler may raise anywhere in this thread, and a run of one process. With
    NCCL a collective returns at once: the read of its result belongs inside the block."""
    try:
        yield
    except (dist.DistError, RuntimeError) as error:
        if not isinstance(error, dist.DistError) and (
            type(error) is not RuntimeError or input_processes_lost(error) is not None or _alone()
        ):
            raise
        raise PeerLost(
            f"{heartbeats.who_was_lost()} during {what} ({first_line(error)})"
        ) from error


def _alone() -> bool:
    """A run of one process has no peer to lose: a plain error of its step is its own."""
    return dist.is_initialized() and dist.get_world_size() == 1


def input_processes_lost(error: BaseException) -> str | None:
    """What the DataLoader's own error says of its input processes (one died, or stopped
    answering), or None where `error` is not that. Raised in torch.utils.data itself, by next() on
    the loader or by its SIGCHLD handler: torch's words. An input process killed while it hands a
    batch over breaks the connection inside multiprocessing, under the DataLoader's next(): the
    same loss, in our words. An error inside an input process is re-raised from elsewhere
    (torch._utils) and keeps its traceback."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return None
    innermost = frames[-1].filename
    if innermost.startswith(_DATALOADER_CODE):
        return first_line(error)
    if (
        isinstance(error, (OSError, EOFError))
        and innermost.startswith(_MULTIPROCESSING_CODE)
        and any(frame.filename.startswith(_DATALOADER_CODE) for frame in frames)
    ):
        return (
            "an input (DataLoader) process was lost as it handed a batch over "
            f"({type(error).__name__}: {first_line(error)})"
        )
    return None


def parameters_digest_everywhere(module: torch.nn.Module) -> str:
    """SHA-256 of this replica's parameters, checked equal on every process; raises if any differs.

    DDP keeps replicas identical by construction; this proves it at the end of a run for the cost
    of one hash and one small all-gather."""
    digest = hashlib.sha256()
    for parameter in module.parameters():
        digest.update(parameter.detach().cpu().contiguous().numpy().tobytes())
    mine = torch.tensor(
        list(digest.digest()[:16]), dtype=torch.uint8, device=next(module.parameters()).device
    )
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    with waiting_for_peers("the all-gather of the parameters' digest"):
        dist.all_gather(everyone, mine)
        differing = [rank for rank, other in enumerate(everyone) if not torch.equal(other, mine)]
    if differing:
        raise RuntimeError(
            f"replicas diverged: ranks {differing} hold other parameters than "
            f"rank {dist.get_rank()}"
        )
    return digest.hexdigest()


def leave_process_group() -> None:
    heartbeats.stop_heartbeat()
    if dist.is_initialized():
        dist.destroy_process_group()
