"""The meeting at MASTER_ADDR:MASTER_PORT of machines whose launcher (mpirun, srun) started one rank
each, the original's way, that starts the machine's training processes itself: machine 0's rank
serves the run's TCPStore on that port, the others wait there until it does."""

from __future__ import annotations

import datetime
import logging
import socket
import time

import torch.distributed as dist

from resnet50_trainer.distributed.rendezvous.meeting import (
    POLL_S,
    PROBE_TIMEOUT_S,
    Meeting,
    first_line,
)
from resnet50_trainer.errors import UserError

log = logging.getLogger(__name__)


def meet_at_master(shard: int, shards: int, master: tuple[str, int], timeout_s: float) -> Meeting:
    """The run's store at `master`, served by shard 0 and reached by the others within
    `timeout_s`; keep the result for the whole run (shard 0's store dies with it)."""
    host, port = master
    where = f"MASTER_ADDR:MASTER_PORT {host}:{port}"
    log.info("Shard %d of %d: meeting the others at %s", shard, shards, where)
    timeout = datetime.timedelta(seconds=timeout_s)
    if shard:
        _wait_for_shard_0(host, port, time.monotonic() + timeout_s, f"shard {shard} of {shards}")
    try:
        store = dist.TCPStore(
            host, port, is_master=shard == 0, wait_for_workers=False, timeout=timeout
        )
    except (dist.DistError, RuntimeError) as error:
        problem = (
            "could not serve the run's store (is MASTER_PORT free on this machine, and "
            "MASTER_ADDR its address?)"
            if shard == 0
            else "lost shard 0's store as it connected"
        )
        raise UserError(
            f"shard {shard} of {shards} {problem} at {where}: {first_line(error)}"
        ) from None
    return Meeting(store, host, port)


def _wait_for_shard_0(host: str, port: int, deadline: float, who: str) -> None:
    """Plain connects until shard 0 listens: a TCPStore client's own retries print C++ errors."""
    while True:
        try:
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
            return
        except OSError as error:
            if time.monotonic() >= deadline:
                raise UserError(
                    f"{who} found no store at MASTER_ADDR:MASTER_PORT {host}:{port} by the "
                    f"deadline ({error.strerror or error}): start rank 0, check that this "
                    "machine reaches that address, or raise --first_iter_timeout"
                ) from None
            time.sleep(POLL_S)
