"""The body of one training process, wherever it was started: forked from the launcher's fork
server or spawned by the launcher (train_as_child_process), started by torchrun, srun or mpirun as
one rank (train_as_launched_rank), or the launcher itself in a run of one process
(train_as_process). Its logging, seed and device; one line for a lost peer; how it tells the
launcher's Ctrl-C from its parent's end."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.sharedctypes import Synchronized
from typing import NoReturn

import torch

from resnet50_trainer import cpython_private, limits, machine
from resnet50_trainer.checkpoint.auto_resume import holds_checkpoints
from resnet50_trainer.commands import report
from resnet50_trainer.config.launchers import Launched
from resnet50_trainer.config.settings import Config
from resnet50_trainer.distributed import joining, process_group
from resnet50_trainer.distributed.devices import claim_device
from resnet50_trainer.distributed.pausing import record_pause_requests
from resnet50_trainer.distributed.preemption import record_stop_signals
from resnet50_trainer.errors import (
    FAILURE_EXIT_STATUS,
    ONE_LINE_ERRORS,
    TRAINER,
    PeerLost,
    RunFailed,
    UserError,
    exit_status,
)
from resnet50_trainer.lifecycle import end_input_processes, leave, stop_watching_input_processes
from resnet50_trainer.streams import guard_standard_streams, log_lines

# Seconds a spawned training process waits, after SIGINT, for a killed launcher to be gone.
LAUNCHER_END_S = 1.0


def train_as_process(local_index: int, config: Config, store_host: str, store_port: int) -> None:
    """The body of one training process: placement, device, process group, training."""
    placement = process_group.placement_for(config, local_index)
    device = _set_up(config, placement)
    with _one_line_if_stopped(config, placement):
        joining.join_process_group(config, placement, store_host, store_port)
        _import_and_train(config, placement, device)


def train_as_launched_rank(launched: Launched, config: Config) -> None:
    """One rank started by torchrun/srun/mpirun: the launcher's placement, device LOCAL_RANK."""
    placement = process_group.Placement(
        launched.rank, launched.world_size, launched.local_rank, launched.local_world_size
    )
    device = _set_up(config, placement)
    with _one_line_if_stopped(config, placement):
        meeting = joining.join_under_launcher(config, launched)  # held for the run
        try:
            _import_and_train(config, placement, device)
        finally:
            if meeting is not None:
                meeting.close()


def _import_and_train(
    config: Config, placement: process_group.Placement, device: torch.device
) -> None:
    """train/trainer.py's train, imported only here: the launcher of several processes trains
    nothing, and the training code's imports (torchvision, and with it dynamo) cost ~3 s of CPU;
    the fork server imports it once for all of them (launch/processes.py's _start_fork_server)."""
    from resnet50_trainer.train.trainer import train

    train(config, placement, device)


def _set_up(config: Config, placement: process_group.Placement) -> torch.device:
    """Logging (the first process speaks), the seed (the same initial weights, run after run),
    multiprocessing's temporary directory, Ctrl-Z where the run has peers
    (distributed/pausing.py) and the device of this training process; the kernel's OOM killer
    takes it (or its input processes) first: whoever started it lives to say so."""
    cpython_private.own_temporary_directory()
    machine.first_for_the_oom_killer()
    log_lines(logging.INFO if placement.is_main else logging.WARNING, force=True)
    if placement.world_size > 1 and not config.test_only:  # --test_only has no check to pause at
        record_pause_requests()
    torch.manual_seed(config.seed)
    return claim_device(config, placement.local_rank)


@contextmanager
def _one_line_if_stopped(config: Config, placement: process_group.Placement) -> Iterator[None]:
    """A lost peer (typed where this process waited on it), lost input processes or a limit of the
    machine (limits.py) end the run with one line; any other error keeps its traceback. The
    process group is left either way."""
    oom_kills = machine.oom_kills()
    try:
        try:
            yield
        finally:  # before an error is looked at: torch's handler would raise inside that
            stop_watching_input_processes()
    except PeerLost as failure:
        # Now, together: a stuck input process would hold the loader's shutdown 5 s each, in turn.
        end_input_processes()
        raise RunFailed(
            f"rank {placement.rank} stopped: {failure}; {cannot_go_on(config)}"
        ) from failure
    except (RuntimeError, OSError, EOFError, MemoryError) as error:
        stopped = _what_stopped(error, oom_kills)
        if stopped is None:
            raise
        raise RunFailed(
            f"rank {placement.rank} stopped: {stopped}; {cannot_go_on(config)}"
        ) from error
    finally:
        process_group.leave_process_group()


def _what_stopped(error: BaseException, oom_kills: int | None) -> str | None:
    """A limit of the machine that `error` ran into, or its input processes lost (by the kernel's
    OOM killer where its count grew since it was `oom_kills`); None for anything else."""
    shortage = limits.shortage_in(error)
    if shortage is not None:
        return shortage
    lost = process_group.input_processes_lost(error)
    if lost is not None and machine.oom_killed_since(oom_kills):
        return f"{lost}: it {limits.death_in_words(signal.SIGKILL, oom_kills)}"
    return lost


def cannot_go_on(config: Config) -> str:
    return f"the run cannot go on without every process: {how_to_go_on(config)}"


def how_to_go_on(config: Config) -> str:
    """How to go on, advice that works whatever the moment: a training run resumes from its
    checkpoints, or starts again where none was saved yet; --test_only, which writes nothing,
    starts again."""
    if config.test_only:
        return "run the same command again to score the checkpoint"
    directory = config.checkpoint_dir
    if config.auto_resume:
        return (
            f"run the same command again: --auto_resume goes on from the newest checkpoint in "
            f"{directory}, if one was saved"
        )
    resume = f"resume it with --load_model_path {directory}"
    try:
        saved = holds_checkpoints(directory, config.save_model_name)
    except UserError:  # it cannot be listed now: both ways
        return f"{resume} if a checkpoint was saved there, else run the same command again"
    if saved:
        return resume
    # One may still be going into place (another process writes it): --auto_resume takes it
    # where there is one, and starts the run afresh where there is none.
    return (
        f"no checkpoint was saved in {directory} yet: run the same command again with --auto_resume"
    )


def train_as_child_process(
    local_index: int,
    config: Config,
    store_host: str,
    store_port: int,
    reported: Synchronized | None = None,
) -> NoReturn:
    """A spawned process reports its failure in one line, unless another process of this machine
    did (`reported`), and exits 2 (user error), 3 (preempted) or 1; the launcher passes that on.
    A stop signal is recorded (distributed/preemption.py); SIGINT stops it as Ctrl-C does. It
    leaves as the command does (lifecycle.leave), never through the interpreter's teardown; only a
    bug's traceback goes back to the launcher through torch's spawn."""
    # The parent's end sends SIGINT (torch sets that as the parent-death signal): the fork
    # server's, with the launcher (launch/fork_server.py) or alone (the OOM killer's choice, say),
    # or the launcher's where it spawned this process.
    parent = os.getppid()
    guard_standard_streams(TRAINER)  # a fresh interpreter's, the fork server's or spawned
    cpython_private.let_the_fork_server_go()  # it starts none from the fork server
    interrupt_once()
    record_stop_signals()
    try:
        try:
            train_as_process(local_index, config, store_host, store_port)
        except KeyboardInterrupt:
            ended = _parent_ended(parent)
            if ended is None:
                raise  # the launcher's Ctrl-C: it reports it
            rank = process_group.placement_for(config, local_index).rank
            raise RunFailed(f"rank {rank} stopped: {ended}; {cannot_go_on(config)}") from None
        status = 0
    except ONE_LINE_ERRORS as error:
        status = report(TRAINER, error) if _first_to_report(reported) else exit_status(error)
    except SystemExit as stop:  # a run-wide stop the first process reported
        status = stop.code if isinstance(stop.code, int) else FAILURE_EXIT_STATUS
    except KeyboardInterrupt:
        status = 0  # stopped by the launcher, which reports it (as torch's spawn would exit)
    leave(status)


def _parent_ended(parent: int) -> str | None:
    """What ended, where this process's parent (pid `parent`) has; None where it lives on. The
    parent is the fork server, or the launcher where it spawned this process (launch/processes.py's
    _start_fork_server falls back to spawn). The parent-death signal comes as the parent's thread
    that started this process ends (prctl(2)): a single-threaded fork server has then ended, but a
    launcher killed may still be ending its other threads (seen: no line at all), so its end is
    waited for a moment (which a Ctrl-C, the launcher alive, then also waits: accepted, spawn being
    the fallback)."""
    launcher = multiprocessing.parent_process()  # the process that asked for this one
    if launcher is not None and launcher.pid == parent:
        launcher.join(LAUNCHER_END_S)
        return None if launcher.is_alive() else f"the launcher that started it (pid {parent}) ended"
    if os.getppid() == parent:
        return None
    return f"the fork server it was started from (pid {parent}) ended, alone or with the launcher"


def _first_to_report(reported: Synchronized | None) -> bool:
    if reported is None:
        return True
    with reported.get_lock():
        first, reported.value = not reported.value, 1
    return first


def interrupt_once() -> None:
    """Ctrl-C: KeyboardInterrupt unwinds the run, so a checkpoint being written is abandoned (its
    temporary file removed) and the last complete one stays. Only the first SIGINT interrupts:
    a second would break into the unwinding (or, past torch's handler, print a traceback). A
    process that does not end is SIGKILLed by the launcher. Stop signals (SIGTERM, SIGUSR1,
    SIGHUP) save and stop instead (record_stop_signals). A SIGINT held while the launcher started
    this process (launch/processes.py's _start) counts from here."""
    interrupted: list[int] = []

    def interrupt(signum, frame):
        # Not SIG_IGN: Python reports a signal pending while its handler is swapped as an OSError.
        # Nor inside a finaliser: a process unwinding its own failure (a peer gone, a bad record)
        # is then ending anyway, and an exception cannot leave a __del__ (an input loader's
        # cleanup), where Python prints it as a traceback.
        if not interrupted and not _in_finaliser(frame):
            interrupted.append(signum)
            raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")

    signal.signal(signal.SIGINT, interrupt)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])


def _in_finaliser(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False
