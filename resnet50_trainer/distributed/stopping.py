"""How a run stops on every process at once: the first process reports why in one line, the
others leave quietly after it (rather than each reporting the first as a lost peer). Policies
return a failure; the epoch loop stops the run with it; train() decides how a process exits."""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn, TypeVar

import torch
import torch.distributed as dist

from resnet50_trainer.distributed import process_group
from resnet50_trainer.distributed.process_group import Placement
from resnet50_trainer.errors import UserError, exit_status


class StoppedByFirst(Exception):
    """The run stops on every process; the first process reports why, and this one (another)
    leaves with exit `status` after it (train() sees to that)."""

    def __init__(self, status: int):
        super().__init__(f"the first process stopped the run (status {status})")
        self.status = status


def stop_run(failure: Exception | None, status: int) -> NoReturn:
    """A stop every process reaches together: the first process raises `failure`, the others
    (given None) raise StoppedByFirst."""
    if failure is not None:
        raise failure
    raise StoppedByFirst(status)


def stop_together(
    failure: Exception | None,
    device: torch.device,
    what: str = "the first process's report on its writes",
) -> None:
    """The first process alone writes the run log, the trace and checkpoints: it says whether
    that failed (`failure`, None on the others), and if so every process stops (stop_run)."""
    outcome = torch.tensor([0 if failure is None else exit_status(failure)], device=device)
    with process_group.waiting_for_peers(what):
        dist.broadcast(outcome, src=0)
        status = int(outcome.item())  # NCCL: the wait is here
    if status:
        stop_run(failure, status)


def wait_for_first_process_to_exit() -> None:
    """Returns once the first process, which reports a run-wide stop, has gone: its line is never
    lost to the launcher ending the run on this process's exit."""
    try:
        dist.barrier()  # the first process never joins: this returns when it has exited
    except (dist.DistError, RuntimeError):
        pass


Done = TypeVar("Done")


def on_first_process(
    do: Callable[[], Done], placement: Placement, device: torch.device, what: str
) -> Done | None:
    """What `do` returns on the first process (None on the others), which alone reads or writes
    the run's files; a UserError there stops every process together (stop_together, waiting on
    `what`), the first reporting it."""
    result, failure = None, None
    if placement.is_main:
        try:
            result = do()
        except UserError as error:
            failure = error
    stop_together(failure, device, what)
    return result
