"""The meeting at MASTER_ADDR:MASTER_PORT of machines whose launcher (mpirun, srun) started one rank
each, the original's way, that starts the machine's training processes itself: machine 0's rank
serves the run's TCPStore on that port, the others wait there until it does."""

from __future__ import annotations

import datetime
import logging

import torch.distributed as dist

from resnet50_trainer.errors import UserError
from resnet50_trainer.rendezvous.meeting import Meeting, first_line

log = logging.getLogger(__name__)


def meet_at_master(shard: int, shards: int, master: tuple[str, int], timeout_s: float) -> Meeting:
    """The run's store at `master`, served by shard 0 and reached by the others within
    `timeout_s`; keep the result for the whole run (shard 0's store dies with it)."""
    host, port = master
    where = f"MASTER_ADDR:MASTER_PORT {host}:{port}"
    log.info("Shard %d of %d: meeting the others at %s", shard, shards, where)
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        if shard == 0:
            store = dist.TCPStore(
                host, port, is_master=True, wait_for_workers=False, timeout=timeout
            )
        else:  # the client retries until shard 0 listens, or the timeout
            store = dist.TCPStore(host, port, is_master=False, timeout=timeout)
    except (dist.DistError, RuntimeError) as error:
        problem = (
            "could not serve the run's store (is MASTER_PORT free on this machine, and "
            "MASTER_ADDR its address?)"
            if shard == 0
            else f"did not reach shard 0's store within {timeout_s:g} s (was rank 0 started, "
            "and does this machine reach MASTER_ADDR?)"
        )
        raise UserError(
            f"shard {shard} of {shards} {problem} at {where}: {first_line(error)}"
        ) from None
    return Meeting(store, host, port)
