"""Ctrl-Z (SIGTSTP) in a run of several processes: each training process only records it here; the
epoch loop folds "did one come" into its next check all-reduce, with the stop signals, so every
process learns it at the same step, where none is inside a collective, and they pause there
together. Stopped at once, a process could be inside a collective, whose limit (Gloo's, NCCL's)
counts the time stopped: continued (fg) after more than --timeout, the wait failed and the run
ended, naming a lost peer. A run of one process, which has no collective, stops at once."""

from __future__ import annotations

import os
import signal

import torch
import torch.distributed as dist

from resnet50_trainer.config.settings import Config
from resnet50_trainer.config.values import NO_TIME_LIMIT_S
from resnet50_trainer.distributed import process_group
from resnet50_trainer.lifecycle import input_processes

_asked: list[int] = []


def record_pause_requests() -> None:
    """From now on Ctrl-Z (SIGTSTP) to this process is recorded, and acted on at the next check.
    Its input processes, forked later, leave it to this one (input_pipeline.ignore_stop_signals),
    which stops them with itself."""
    signal.signal(signal.SIGTSTP, lambda signum, frame: _asked.append(signum))


def pause_asked() -> bool:
    return bool(_asked)


def pause_together(config: Config, device: torch.device) -> None:
    """Every process learnt at the same check that Ctrl-Z came, to it or to a peer. Each that
    received it stops here with its input processes, as Ctrl-Z would have stopped them, until
    continued (fg: SIGCONT); the others (on another machine, say) wait for it, without a time
    limit. A Ctrl-Z that reached this process meanwhile, late, was the same one."""
    if _asked:
        _stop_here()
    done = torch.zeros(1, device=device)
    with (
        process_group.long_wait(config, NO_TIME_LIMIT_S),
        process_group.waiting_for_peers("the pause after Ctrl-Z"),
    ):
        dist.all_reduce(done)
        done.item()  # NCCL: the wait is here
    _asked.clear()


def _stop_here() -> None:
    stopped = [child.pid for child in input_processes() if child.pid is not None]
    for pid in stopped:
        os.kill(pid, signal.SIGSTOP)
    os.kill(os.getpid(), signal.SIGSTOP)  # returns once this process is continued
    for pid in stopped:  # with it, by whoever continued it
        os.kill(pid, signal.SIGCONT)
