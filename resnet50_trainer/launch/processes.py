"""One training process per device of this machine (GPU, or CPU worker with --use_cpu), or none of
our own when torchrun, srun or mpirun started this process as one rank of one device; a launcher's
one rank per machine (the original's way) starts them as a run without a launcher does."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence

import torch.multiprocessing as mp

from resnet50_trainer import cpython_private, limits, machine
from resnet50_trainer.config.launchers import Launched
from resnet50_trainer.config.settings import Config
from resnet50_trainer.distributed import joining, process_group, transport
from resnet50_trainer.distributed.preemption import record_stop_signals
from resnet50_trainer.errors import (
    PREEMPTED_EXIT_STATUS,
    TRAINER,
    USAGE_EXIT_STATUS,
    RunFailed,
    error_line,
)
from resnet50_trainer.launch import preflight
from resnet50_trainer.launch.children import forward_stop_signals, wait_for
from resnet50_trainer.launch.training_process import (
    cannot_go_on,
    how_to_go_on,
    interrupt_once,
    train_as_child_process,
    train_as_launched_rank,
    train_as_process,
)
from resnet50_trainer.launch.watcher import watched
from resnet50_trainer.lifecycle import PREEMPT_SIGNALS, preempt_signals_blocked

log = logging.getLogger(__name__)
# Seconds the other processes get to end by themselves (and report) once one has failed, and
# again after SIGTERM, before they are killed.
GRACE_PERIOD_S = 3.0


def launch(
    config: Config, launched: Launched | None = None, start_lines: Sequence[str] = ()
) -> int:
    """Start the run's processes on this machine and return the exit status of the run; an error
    of this process (a one-line one included) is raised for the command line to report.
    `start_lines` (what --recipe and --solver set) are logged once the inputs are accepted: a
    refusal before then is its one line alone."""
    lock = None
    # Once a machine, not once a rank; and in global rank 0's process, which writes the
    # checkpoints, wherever a launcher placed it (this process lives as long as the run there).
    if launched is None or launched.local_rank == 0 or launched.rank == 0:
        writes_checkpoints = config.shard_id == 0 if launched is None else launched.rank == 0
        lock = preflight.check_inputs(config, writes_checkpoints)
    try:
        if launched is None or launched.rank == 0:
            for line in start_lines:
                log.info("%s", line)
        return _join_the_run(config, launched)
    finally:
        if lock is not None:
            lock.release()


def _join_the_run(config: Config, launched: Launched | None) -> int:
    """This machine's part of the run: as one rank of a launcher's, or as this machine's own
    training processes once the machines have met (joining.meet_shards)."""
    transport.configure_transport(config.distributed_transport, config.distributed_interfaces)
    cpython_private.quiet_resource_tracker_warnings()
    record_stop_signals()  # from here on a stop signal is never this process's death
    interrupt_once()
    if launched is not None and not _runs_as_without_launcher(config, launched):
        train_as_launched_rank(launched, config)
        return 0
    # Held until the run ends: in shard 0 this process serves the run's store.
    meeting = joining.meet_shards(config, launched.master if launched else None)
    try:
        return _train_in_own_processes(config, meeting.host, meeting.port)
    finally:
        meeting.close()


def _runs_as_without_launcher(config: Config, launched: Launched) -> bool:
    """mpirun or srun the original's way: the launcher's one rank on this machine, asked for
    --num_gpus processes (build.adopt_launcher made the ranks the shards). Or the launcher's only
    rank, with no MASTER_ADDR to meet at: one rank needs no meeting."""
    one_rank_per_machine = launched.local_world_size == 1 and config.processes_per_machine > 1
    return one_rank_per_machine or (launched.world_size == 1 and launched.master is None)


def _train_in_own_processes(config: Config, store_host: str, store_port: int) -> int:
    """This machine's training processes, ours and not a launcher's: this process alone where the
    machine has one, else those it starts and waits for; this one watched (launch/watcher.py), as
    it has no launcher of its own to name its death."""
    if config.processes_per_machine == 1:
        with watched(config, "the training process"):
            train_as_process(0, config, store_host, store_port)
        return 0
    try:
        with watched(config, "the launcher"):
            return _start_and_wait(config, store_host, store_port)
    finally:  # one fork server a launch: cli.main called again gets a fresh one
        cpython_private.stop_fork_server()


def _start_and_wait(config: Config, store_host: str, store_port: int) -> int:
    processes: list = []
    oom_kills = machine.oom_kills()
    try:
        # The stop signals and SIGINT held pending while the processes start (each unblocks them
        # once it has set what they do to it), and while multiprocessing starts its resource
        # tracker and the fork server: SIGUSR1 to the process group would kill them, and a Ctrl-C
        # broke into the server's import of the training code (a traceback of up to 75 lines
        # before "interrupted"). Here too, a Ctrl-C counts once they have started.
        with preempt_signals_blocked(signal.SIGINT), _ctrl_c_held():
            cpython_private.start_resource_tracker((signal.SIGINT, *PREEMPT_SIGNALS))
            start_method = _start_fork_server()
            # One line from this machine: its processes mostly fail for one reason (a lost peer,
            # a store out of reach), and the first to report it speaks for all. Held here until
            # they end: collected, its semaphore is unlinked, and one still starting fails.
            reported = mp.get_context(start_method).Value("b", 0)
            try:
                context = mp.start_processes(
                    train_as_child_process,
                    args=(config, store_host, store_port, reported),
                    nprocs=config.processes_per_machine,
                    join=False,
                    start_method=start_method,
                )
            except (EOFError, ConnectionError) as lost:  # its pipe or socket, mid-answer
                ended = f"ended as they started ({lost or type(lost).__name__})"
                if machine.oom_killed_since(oom_kills):
                    ended = limits.death_in_words(signal.SIGKILL, oom_kills)
                raise RunFailed(
                    f"the fork server that starts the training processes {ended}; run the same "
                    "command again"
                ) from lost
            processes = context.processes
            forward_stop_signals(processes)
        wait_for(context)
    except KeyboardInterrupt:
        _stop_all(processes)
        raise
    except mp.ProcessExitedException as failure:
        if failure.signal_name:  # no last words from a killed process: name it here
            killed = _killed(config, failure, processes, oom_kills)
            print(error_line(TRAINER, killed), file=sys.stderr)
        # Otherwise the failed process already printed its one-line reason (or its traceback).
        passed_on = (USAGE_EXIT_STATUS, PREEMPTED_EXIT_STATUS)
        return failure.exit_code if failure.exit_code in passed_on else 1
    except mp.ProcessRaisedException as failure:
        print(failure, file=sys.stderr)
        return 1
    return 0


@contextlib.contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """SIGINT to this process while the body runs is raised again as it ends. Not only blocked:
    a signal sent to the process goes to any thread that does not block it (the store's), and
    Python raises it in the main thread at once (the launcher then stopped the fork server as it
    started the training processes, which each said it had ended)."""
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            signal.raise_signal(signal.SIGINT)


def _killed(
    config: Config, failure: mp.ProcessExitedException, processes, oom_kills: int | None
) -> str:
    """The line for a training process that ended by a signal: the kernel's OOM killer's (its
    count grew since it was `oom_kills`), a crash, or another's. With NCCL a lost or silent peer
    never raises in Python: NCCL's watchdog aborts the waiting process (SIGABRT) once --timeout
    has run out, so SIGABRT there is a lost peer, named where it was one of this machine's."""
    rank = process_group.placement_for(config, failure.error_index).rank
    who = f"training process of rank {rank} (pid {failure.error_pid})"
    if failure.signal_name != "SIGABRT" or config.use_cpu:
        died = limits.death_in_words(signal.Signals(-failure.exit_code), oom_kills)
        return f"{who} {died}; the run stopped: {how_to_go_on(config)}"
    gone = [
        process_group.placement_for(config, index).rank
        for index, process in enumerate(processes)
        if index != failure.error_index and process.exitcode not in (None, 0, -signal.SIGABRT)
    ]
    peer = f"rank {', '.join(map(str, gone))} of this machine" if gone else "a peer"
    return (
        f"{who} stopped: {peer} was lost or stopped answering, and NCCL's watchdog ended "
        f"the wait with SIGABRT at its limit (--timeout {config.timeout:g} s; "
        f"--first_iter_timeout {config.first_iter_timeout:g} s in the first step and the "
        f"checkpoint barrier); {cannot_go_on(config)}"
    )


def _start_fork_server() -> str:
    """The start method of the training processes: a fork server (a fresh interpreter, this
    process's child, which has touched neither CUDA nor threads) that imports a training process's
    code (launch/training_process.py, train/trainer.py) once; each process is forked from it
    instead of importing it again (~5 s of CPU each). It starts with the stop signals blocked
    (preempt_signals_blocked) and keeps them so: a stop signal to the process group leaves it be,
    and its children inherit the mask as spawned ones did. It ends with this process
    (launch/fork_server.py), and its children then get SIGINT, torch's parent-death signal. Spawn
    where it cannot start: TMPDIR full, or its socket's path in TMPDIR longer than a Unix socket
    takes (108 bytes; newer Pythons then put the socket in /tmp themselves, gh-132124)."""
    # By name: imported here, fork_server would tie this process to its own parent.
    try:
        cpython_private.start_fork_server(
            [
                "resnet50_trainer.launch.fork_server",
                "resnet50_trainer.launch.training_process",
                "resnet50_trainer.train.trainer",
            ]
        )
    except OSError:
        return "spawn"
    return "forkserver"


def _stop_all(processes) -> None:
    """Ctrl-C on the launcher: SIGINT each training process, then SIGKILL stragglers."""
    for process in processes:
        if process.is_alive():
            os.kill(process.pid, signal.SIGINT)
    for process in processes:
        process.join(GRACE_PERIOD_S)
        if process.is_alive():
            process.kill()
            process.join()
