"""How a process meets its peers and joins the process group. Three ways to meet: one machine, our
own launcher: a TCPStore that the launching process serves on a free port; several machines
(shards), our own launcher: the launching process of each shard meets the others through Redis or
a shared directory (rendezvous/), and its processes join the store found there; torchrun, srun or
mpirun started us: each process meets at MASTER_ADDR:MASTER_PORT when the launcher gives one
(env://), else through Redis or a shared directory like shards, one rank each (mpirun or srun's
one rank per machine, the original's way, meets like a shard)."""

from __future__ import annotations

import datetime
import logging
import socket

import torch
import torch.distributed as dist
import torch.utils.data

from resnet50_trainer.config.launchers import Launched
from resnet50_trainer.config.settings import Config
from resnet50_trainer.distributed import heartbeats, rendezvous, transport
from resnet50_trainer.distributed.process_group import Placement
from resnet50_trainer.distributed.rendezvous.master import meet_at_master
from resnet50_trainer.distributed.rendezvous.meeting import Meeting, Seat, first_line, meet
from resnet50_trainer.errors import UserError

log = logging.getLogger(__name__)


LOCALHOST = "127.0.0.1"


STORE_CONNECT_TIMEOUT_S = 30.0


JOINED_KEY = "joined"  # "joined/<rank>" on the run's store: who reached the process group


def meet_shards(config: Config, master: tuple[str, int] | None = None) -> Meeting:
    """The launching process's meeting: a local store for one shard, else the shards' rendezvous,
    at `master` (a launcher's MASTER_ADDR:MASTER_PORT) when given. Keep the result for the whole
    run: shard 0's launching process serves the run's store."""
    if config.num_shards == 1:
        store = dist.TCPStore(
            LOCALHOST,
            0,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=config.first_iter_timeout),
        )
        return Meeting(store, LOCALHOST, store.port)
    if master is not None:
        return meet_at_master(config.shard_id, config.num_shards, master, config.first_iter_timeout)
    return _meet_through_board(
        config, Seat(config.shard_id, config.num_shards, "shard", _board_run_id(config))
    )


def join_process_group(config: Config, placement: Placement, host: str, port: int) -> None:
    """Join the run's process group through the store at host:port: NCCL on GPUs, Gloo on CPUs."""
    first = datetime.timedelta(seconds=config.first_iter_timeout)
    try:  # a plain connect fails at once on a dead port, where TCPStore would retry until `first`
        socket.create_connection((host, port), timeout=STORE_CONNECT_TIMEOUT_S).close()
        store = dist.TCPStore(host, port, is_master=False, timeout=first)
    except (OSError, RuntimeError) as error:
        raise UserError(
            f"could not reach the run's store at {host}:{port} ({first_line(error)}); "
            "check that shard 0's launching process is alive"
        ) from error
    _form_group(
        config,
        store,
        (host, port),
        placement.rank,
        placement.world_size,
        placement.local_world_size,
    )


def join_under_launcher(config: Config, launched: Launched) -> Meeting | None:
    """torchrun/srun/mpirun: this process is one rank. Returns the meeting to keep, if any."""
    if launched.master is not None:
        timeout = datetime.timedelta(seconds=config.first_iter_timeout)
        try:
            store, _, _ = next(
                dist.rendezvous("env://", launched.rank, launched.world_size, timeout=timeout)
            )
            if launched.round_prefix:  # a store that outlives this round (torchrun's agent's)
                store = dist.PrefixStore(launched.round_prefix, store)
            dist.init_process_group(
                _backend(config),
                store=store,
                rank=launched.rank,
                world_size=launched.world_size,
                timeout=timeout,
                device_id=_bound_device(config),
            )
        except (dist.DistError, RuntimeError) as error:
            raise UserError(
                f"rank {launched.rank} could not form the process group at "
                f"MASTER_ADDR:MASTER_PORT {launched.master[0]}:{launched.master[1]} "
                f"({first_line(error)}): check that every rank was started and "
                "reaches that address"
            ) from None
        heartbeats.start_heartbeat(
            launched.master, launched.rank, launched.world_size, launched.local_world_size
        )
        return None
    meeting = _meet_through_board(
        config, Seat(launched.rank, launched.world_size, "rank", _board_run_id(config))
    )
    _form_group(
        config,
        meeting.store,
        (meeting.host, meeting.port),
        launched.rank,
        launched.world_size,
        launched.local_world_size,
    )
    return meeting


def _form_group(
    config: Config,
    store: dist.Store,
    address: tuple[str, int],
    rank: int,
    world_size: int,
    per_machine: int,
) -> None:
    """init_process_group on the run's store at `address`. Each rank checks in and starts its
    heartbeat first, so that a failure names the ranks that did not join, or that stopped
    answering after they did."""
    where = f"{address[0]}:{address[1]}"
    try:
        store.add(f"{JOINED_KEY}/{rank}", 1)
        heartbeats.start_heartbeat(address, rank, world_size, per_machine)
        dist.init_process_group(
            _backend(config),
            store=store,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=config.first_iter_timeout),
            device_id=_bound_device(config),
        )
    except (dist.DistError, RuntimeError) as error:
        try:
            missing = [r for r in range(world_size) if not store.check([f"{JOINED_KEY}/{r}"])]
        except (dist.DistError, RuntimeError):
            raise UserError(
                f"rank {rank} lost the run's store at {where} while the process group "
                f"formed ({first_line(error)}): shard 0's launching process, which "
                "serves it, is gone; start the run again"
            ) from None
        who = (
            f"{heartbeats.ranks_named(missing, per_machine)} of {world_size} did not join"
            if missing
            else heartbeats.who_was_lost()
        )
        raise UserError(
            f"rank {rank} could not form the process group: {who} "
            f"({first_line(error)}; store {where}): start every process of the run, "
            "or raise --first_iter_timeout"
        ) from None


def _board_run_id(config: Config) -> str:
    """The id the board keys the meeting by (build.run_id_of asks for one wherever machines meet
    through a board, before anything is written)."""
    if config.run_id is None:
        raise UserError(
            "a meeting through Redis or a shared directory needs --run_id: give every machine "
            "the same new id, e.g. --run_id $(uuidgen)"
        )
    return config.run_id


def _meet_through_board(config: Config, seat: Seat) -> Meeting:
    board = rendezvous.open_board(
        seat.run_id,
        config.redis_host,
        config.redis_port,
        config.redis_password,
        config.file_store_path,
    )
    host = transport.advertised_host(
        config.distributed_interfaces, config.distributed_transport, config.redis_host
    )
    log.info(
        "%s %d of %d: meeting the others of run %s via %s",
        seat.noun.capitalize(),
        seat.index,
        seat.count,
        seat.run_id,
        board.where,
    )
    return meet(board, seat, host, config.first_iter_timeout)


def _backend(config: Config) -> str:
    """NCCL between GPUs; Gloo on CPUs and between processes sharing a GPU, which NCCL refuses."""
    return "gloo" if config.use_cpu or config.gpus_shared else "nccl"


def _bound_device(config: Config) -> torch.device | None:
    """NCCL's communicator bound to this process's GPU (claim_device set it current): created at
    once, where it would be created at the first collective, after a guess of the device that the
    first barrier warns of. Not with --model_parallel: a replica's second GPU is this process's
    too, and a group bound to the first refuses collectives there."""
    if _backend(config) != "nccl" or config.model_parallel:
        return None
    return torch.device("cuda", torch.cuda.current_device())
