"""One training process per device of this machine (GPU, or CPU worker with --use_cpu), or none of
our own when torchrun, srun or mpirun started this process as one rank of one device; a launcher's
one rank per machine (the original's way) starts them as a run without a launcher does."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from multiprocessing import forkserver, resource_tracker
from multiprocessing.sharedctypes import Synchronized
from typing import NoReturn

import torch
import torch.multiprocessing as mp

from resnet50_trainer.checkpoint.auto_resume import holds_checkpoints
from resnet50_trainer.config.launchers import Launched
from resnet50_trainer.config.settings import Config
from resnet50_trainer.distributed import joining, process_group, transport
from resnet50_trainer.distributed.devices import claim_device
from resnet50_trainer.distributed.preemption import record_stop_signals
from resnet50_trainer.distributed.rendezvous.meeting import first_line
from resnet50_trainer.errors import (
    FAILURE_EXIT_STATUS,
    ONE_LINE_ERRORS,
    PREEMPT_SIGNALS,
    PREEMPTED_EXIT_STATUS,
    TRAINER,
    USAGE_EXIT_STATUS,
    PeerLost,
    RunFailed,
    UserError,
    error_line,
    exit_status,
    leave,
    preempt_signals_blocked,
    report,
)
from resnet50_trainer.launch import preflight
from resnet50_trainer.launch.children import forward_stop_signals, wait_for

log = logging.getLogger(__name__)
# Seconds the other processes get to end by themselves (and report) once one has failed, and
# again after SIGTERM, before they are killed.
GRACE_PERIOD_S = 3.0
# Seconds a spawned training process waits, after SIGINT, for a killed launcher to be gone.
LAUNCHER_END_S = 1.0


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
        return _run(config, launched)
    finally:
        if lock is not None:
            lock.release()


def _run(config: Config, launched: Launched | None) -> int:
    transport.configure_transport(config.distributed_transport, config.distributed_interfaces)
    _quiet_resource_tracker()
    record_stop_signals()  # from here on a stop signal is never this process's death
    _interrupt_once()
    if launched is not None and not _runs_as_without_launcher(config, launched):
        _run_launched(launched, config)
        return 0
    # Held until the run ends: in shard 0 this process serves the run's store.
    meeting = joining.meet_shards(config, launched.master if launched else None)
    try:
        return _run_processes(config, meeting.host, meeting.port)
    finally:
        meeting.close()


def _quiet_resource_tracker() -> None:
    """multiprocessing's resource tracker (started later, with this interpreter's -W options)
    cleans up the semaphores of an input or training process that was killed, and would warn
    of each such "leak" at the end of the run: after a kill -9 the run's line is the report."""
    sys.warnoptions.append("ignore:resource_tracker:UserWarning")


def _runs_as_without_launcher(config: Config, launched: Launched) -> bool:
    """mpirun or srun the original's way: the launcher's one rank on this machine, asked for
    --num_gpus processes (build.adopt_launcher made the ranks the shards). Or the launcher's only
    rank, with no MASTER_ADDR to meet at: one rank needs no meeting."""
    one_rank_per_machine = launched.local_world_size == 1 and config.processes_per_machine > 1
    return one_rank_per_machine or (launched.world_size == 1 and launched.master is None)


def _run_processes(config: Config, store_host: str, store_port: int) -> int:
    if config.processes_per_machine == 1:
        run_process(0, config, store_host, store_port)
        return 0
    try:
        return _start_and_wait(config, store_host, store_port)
    finally:
        _stop_fork_server()


def _start_and_wait(config: Config, store_host: str, store_port: int) -> int:
    # Blocked while the children start (they unblock them once ready), and while multiprocessing
    # starts its resource tracker and the fork server, which SIGUSR1 to the process group would
    # otherwise kill.
    with preempt_signals_blocked():
        _start_resource_tracker()
        start_method = _start_fork_server()
        # One line from this machine: its processes mostly fail for one reason (a lost peer, a
        # store out of reach), and the first to report it speaks for all.
        reported = mp.get_context(start_method).Value("b", 0)
        try:
            context = mp.start_processes(
                _run_spawned,
                args=(config, store_host, store_port, reported),
                nprocs=config.processes_per_machine,
                join=False,
                start_method=start_method,
            )
        except (EOFError, ConnectionError) as lost:  # its pipe or socket, mid-answer
            raise RunFailed(
                f"the fork server that starts the training processes ended as they started "
                f"({lost or type(lost).__name__}): run the same command again"
            ) from lost
        forward_stop_signals(context.processes)
    try:
        wait_for(context)
    except KeyboardInterrupt:
        _stop_all(context.processes)
        raise
    except mp.ProcessExitedException as failure:
        if failure.signal_name:  # no last words from a killed process: name it here
            print(error_line(TRAINER, _killed(config, failure, context.processes)), file=sys.stderr)
        # Otherwise the failed process already printed its one-line reason (or its traceback).
        passed_on = (USAGE_EXIT_STATUS, PREEMPTED_EXIT_STATUS)
        return failure.exit_code if failure.exit_code in passed_on else 1
    except mp.ProcessRaisedException as failure:
        print(failure, file=sys.stderr)
        return 1
    return 0


def _killed(config: Config, failure: mp.ProcessExitedException, processes) -> str:
    """The line for a training process that ended by a signal. With NCCL a lost or silent peer
    never raises in Python: NCCL's watchdog aborts the waiting process (SIGABRT) once --timeout
    has run out, so SIGABRT there is a lost peer, named where it was one of this machine's."""
    rank = process_group.placement_for(config, failure.error_index).rank
    who = f"training process of rank {rank} (pid {failure.error_pid})"
    if failure.signal_name != "SIGABRT" or config.use_cpu:
        return f"{who} was killed by {failure.signal_name}; the run stopped: {_again(config)}"
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
        f"checkpoint barrier); {_cannot_go_on(config)}"
    )


def _start_fork_server() -> str:
    """The start method of the training processes: a fork server (a fresh interpreter, this
    process's child, which has touched neither CUDA nor threads) that imports this module and the
    training code once; each process is forked from it instead of importing them again (~5 s of
    CPU each). It starts with the stop signals blocked (preempt_signals_blocked)
    and keeps them so: a stop signal to the process group leaves it be, and its children inherit
    the mask as spawned ones did. It ends with this process (launch/fork_server.py), and its
    children then get SIGINT, torch's parent-death signal. Spawn where it cannot start: its
    socket's path in TMPDIR longer than a Unix socket takes (108 bytes), or TMPDIR full."""
    # By name: imported here, fork_server would tie this process to its own parent.
    forkserver.set_forkserver_preload(
        ["resnet50_trainer.launch.fork_server", __name__, "resnet50_trainer.train.run"]
    )
    try:
        forkserver.ensure_running()
    except OSError:
        return "spawn"
    return "forkserver"


def _stop_fork_server() -> None:
    """A fork server serves one launch: another in this process (cli.main called again) gets a
    fresh one, with the environment and standard streams it has then. Once every training
    process has ended (the server waits for them); CPython's own stop, which its tests use."""
    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is not None:
        with contextlib.suppress(OSError):  # its socket's folder already gone: nothing to undo
            stop()


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker, which the context's first lock or process
    would start, and block the stop signals again: starting it unblocks SIGINT and SIGTERM in this
    thread (CPython's guard against bpo-33613 ends with SIG_UNBLOCK, not the mask it found), so the
    children would start with SIGTERM unblocked and die by one sent before they record it."""
    resource_tracker.ensure_running()
    signal.pthread_sigmask(signal.SIG_BLOCK, PREEMPT_SIGNALS)


def run_process(local_index: int, config: Config, store_host: str, store_port: int) -> None:
    """The body of one training process: placement, device, process group, training."""
    placement = process_group.placement_for(config, local_index)
    device = _set_up(config, placement)
    with _one_line_if_lost(config, placement):
        joining.join_process_group(config, placement, store_host, store_port)
        _train(config, placement, device)


def _run_launched(launched: Launched, config: Config) -> None:
    """One rank started by torchrun/srun/mpirun: the launcher's placement, device LOCAL_RANK."""
    placement = process_group.Placement(
        launched.rank, launched.world_size, launched.local_rank, launched.local_world_size
    )
    device = _set_up(config, placement)
    with _one_line_if_lost(config, placement):
        meeting = joining.join_under_launcher(config, launched)  # held for the run
        try:
            _train(config, placement, device)
        finally:
            if meeting is not None:
                meeting.close()


def _train(config: Config, placement: process_group.Placement, device: torch.device) -> None:
    """train.run's train, imported here: the launcher of several processes trains nothing, and
    the training code's imports (torchvision, and with it dynamo) cost ~3 s of CPU; the fork
    server imports it once for all of them (_start_fork_server)."""
    from resnet50_trainer.train.run import train

    train(config, placement, device)


def _set_up(config: Config, placement: process_group.Placement) -> torch.device:
    """Logging (the first process speaks), the seed (the same initial weights, run after run) and
    the device of this training process."""
    logging.basicConfig(
        level=logging.INFO if placement.is_main else logging.WARNING,
        format="%(message)s",
        force=True,
    )
    torch.manual_seed(config.seed)
    return claim_device(config, placement.local_rank)


@contextmanager
def _one_line_if_lost(config: Config, placement: process_group.Placement) -> Iterator[None]:
    """A lost peer (typed where this process waited on it) or lost input processes end the run with
    one line; any other error keeps its traceback. The process group is left either way."""
    try:
        yield
    except PeerLost as failure:
        raise RunFailed(
            f"rank {placement.rank} stopped: {failure}; {_cannot_go_on(config)}"
        ) from failure
    except (RuntimeError, OSError, EOFError) as error:
        if not process_group.raised_by_input_processes(error):
            raise
        raise RunFailed(
            f"rank {placement.rank} stopped: {first_line(error)}; {_cannot_go_on(config)}"
        ) from error
    finally:
        process_group.leave_process_group()


def _cannot_go_on(config: Config) -> str:
    return f"the run cannot go on without every process: {_again(config)}"


def _again(config: Config) -> str:
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


def _run_spawned(
    local_index: int,
    config: Config,
    store_host: str,
    store_port: int,
    reported: Synchronized | None = None,
) -> NoReturn:
    """A spawned process reports its failure in one line, unless another process of this machine
    did (`reported`), and exits 2 (user error), 3 (preempted) or 1; the launcher passes that on.
    A stop signal is recorded (distributed/preemption.py); SIGINT stops it as Ctrl-C does. It
    leaves as the command does (errors.leave), never through the interpreter's teardown; only a
    bug's traceback goes back to the launcher through torch's spawn."""
    # The parent's end sends SIGINT (torch sets that as the parent-death signal): the fork
    # server's, with the launcher (launch/fork_server.py) or alone (the OOM killer's choice, say),
    # or the launcher's where it spawned this process.
    parent = os.getppid()
    _own_temporary_directory()
    _interrupt_once()
    record_stop_signals()
    try:
        try:
            run_process(local_index, config, store_host, store_port)
        except KeyboardInterrupt:
            ended = _parent_ended(parent)
            if ended is None:
                raise  # the launcher's Ctrl-C: it reports it
            rank = process_group.placement_for(config, local_index).rank
            raise RunFailed(f"rank {rank} stopped: {ended}; {_cannot_go_on(config)}") from None
        status = 0
    except ONE_LINE_ERRORS as error:
        status = report(TRAINER, error) if _first_to_report(reported) else exit_status(error)
    except SystemExit as stop:  # a run-wide stop the first process reported
        status = stop.code if isinstance(stop.code, int) else FAILURE_EXIT_STATUS
    except KeyboardInterrupt:
        status = 0  # stopped by the launcher, which reports it (as torch's spawn would exit)
    leave(status)


def _own_temporary_directory() -> None:
    """multiprocessing's temporary directory (where input processes put the socket they pass file
    descriptors through) becomes this process's own, made now so that the input processes it
    forks share it, and removed as it ends, after them. Inherited, it was the launcher's, removed
    as the launcher ended: input processes orphaned by a killed fork server then each printed a
    FileNotFoundError traceback as they went. CPython keeps the directory in the process's
    private _config (3.8 to 3.14)."""
    multiprocessing.current_process()._config.pop("tempdir", None)  # type: ignore[attr-defined]
    multiprocessing.util.get_temp_dir()


def _parent_ended(parent: int) -> str | None:
    """What ended, where this process's parent (pid `parent`) has; None where it lives on. The
    parent is the fork server, or the launcher where it spawned this process (_start_fork_server's
    fallback). The parent-death signal comes as the parent's thread that started this process
    ends (prctl(2)): a single-threaded fork server has then ended, but a launcher killed may still
    be ending its other threads (seen: no line at all), so its end is waited for a moment."""
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


def _interrupt_once() -> None:
    """Ctrl-C: KeyboardInterrupt unwinds the run, so a checkpoint being written is abandoned (its
    temporary file removed) and the last complete one stays. Only the first SIGINT interrupts:
    a second would break into the unwinding (or, past torch's handler, print a traceback). A
    process that does not end is SIGKILLed by the launcher. Stop signals (SIGTERM, SIGUSR1) save
    and stop instead (record_stop_signals)."""
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


def _in_finaliser(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


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
