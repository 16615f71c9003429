"""How input processes start, and what they report of their own errors (data/input_pipeline.py).

They are forked from their training process, however that one started: a training process of
our launcher is forked from its fork server, which makes forkserver multiprocessing's default
there (spawn did the same), and each input process was once started afresh that way.

A training process killed while an input process hands it a batch breaks the connection inside
multiprocessing's resource sharer, the input process's thread that passes the batch's shared
memory; the sharer reported that through sys.excepthook as a traceback beside the run's two lines
(tests/system/test_fault_output.py, once, on a loaded machine). Here the real sharer, and a
receiver that goes away mid-handshake."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.context
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing import resource_sharer

import pytest
import torch
from torch._utils import ExceptionWrapper

from resnet50_trainer.data.batch import Batch
from resnet50_trainer.data.cpu_decode import CpuDecode
from resnet50_trainer.data.dataset import ImageRecords
from resnet50_trainer.data.formats.databases import read_keys
from resnet50_trainer.data.input_pipeline import (
    make_loader,
    quiet_when_the_receiver_is_gone,
    start_input_process,
)
from resnet50_trainer.data.prefetch import BatchWaits, DevicePrefetcher, StopWhileWaiting
from resnet50_trainer.distributed import process_group
from resnet50_trainer.errors import PeerLost
from resnet50_trainer.launch.training_process import _one_line_if_stopped
from resnet50_trainer.lifecycle import end_input_processes
from resnet50_trainer.limits import shortage_in
from resnet50_trainer.streams import is_open
from resnet50_trainer.train.inputs import input_settings
from tests.support.dbfactory import write_image_db
from tests.support.trainer_runs import SMALL_RUN, children, config_of, run_python, wait_for


def test_input_processes_are_forked_whatever_multiprocessing_s_default(tmp_path, monkeypatch):
    monkeypatch.setattr(multiprocessing.context, "_default_context", ForkServerDefault())
    db = write_image_db(str(tmp_path / "db"), 4, 2)
    settings = input_settings(config_of(*SMALL_RUN, "--train_data", db), train=False)
    records = ImageRecords(db, "lmdb", read_keys(db, "lmdb"), settings, False, CpuDecode(settings))
    loader = make_loader(records, [[0, 1], [2, 3]], 1, False)
    assert loader.multiprocessing_context.get_start_method() == "fork"
    assert [len(batch.labels) for batch in loader] == [2, 2]


class ForkServerDefault(multiprocessing.context.DefaultContext):
    """multiprocessing's default in a process the fork server started."""

    def __init__(self):
        super().__init__(multiprocessing.get_context("forkserver"))


def test_a_receiver_gone_mid_handover_leaves_no_traceback(monkeypatch):
    reported: list[type] = []
    reached: list[type] = []
    quiet = quiet_when_the_receiver_is_gone(lambda kind, value, tb: reported.append(kind))

    def excepthook(kind, value, tb) -> None:
        reached.append(kind)
        quiet(kind, value, tb)

    monkeypatch.setattr(sys, "excepthook", excepthook)
    read_end, write_end = os.pipe()
    try:
        resource_sharer.DupFd(read_end)  # the sharer starts, as for a batch handed over
        receiver = socket.socket(socket.AF_UNIX)
        receiver.connect(resource_sharer._resource_sharer._address)  # type: ignore[attr-defined]
        receiver.close()  # before the sharer's challenge is answered: a receiver killed
        wait_for(lambda: bool(reached), 30, "the sharer to find its receiver gone")
    finally:
        resource_sharer.stop()
        os.close(read_end)
        os.close(write_end)
    assert issubclass(reached[0], (ConnectionError, EOFError)), reached
    assert reported == []


def test_any_other_error_of_an_input_process_keeps_its_traceback():
    reported: list[type] = []
    quiet = quiet_when_the_receiver_is_gone(lambda kind, value, tb: reported.append(kind))
    for error in (ConnectionResetError("elsewhere"), ValueError("a bug")):
        try:
            raise error
        except Exception:
            quiet(*sys.exc_info())
    assert reported == [ConnectionResetError, ValueError]


@pytest.mark.parametrize("ending", ["an error", "a return"])
def test_an_input_process_that_ends_after_the_training_body_raises_nothing(tmp_path, ending):
    """Torch's SIGCHLD handler raises wherever the main thread is when an input process dies. Once
    a training process's body has ended, it must raise nowhere: in CI an input process killed as
    it handed a batch over broke the handover (ConnectionResetError), and the handler then raised
    a second error in the code telling what the first one was: a traceback, not one line."""
    db = write_image_db(str(tmp_path / "db"), 4, 2)
    config = config_of(*SMALL_RUN, "--train_data", db)
    settings = input_settings(config, train=False)
    records = ImageRecords(db, "lmdb", read_keys(db, "lmdb"), settings, False, CpuDecode(settings))
    batches = iter(make_loader(records, [[0, 1], [2, 3]], 1, False))  # torch sets its handler
    torch_s_handler = signal.getsignal(signal.SIGCHLD)
    (input_process,) = batches._workers  # type: ignore[attr-defined]
    try:
        with contextlib.suppress(ConnectionResetError):
            with _one_line_if_stopped(config, process_group.Placement(0, 1, 0, 1)):
                if ending == "an error":
                    raise ConnectionResetError("not the input process's doing")
        assert input_process.pid is not None
        os.kill(input_process.pid, signal.SIGKILL)
        wait_for(lambda: not input_process.is_alive(), 30, "the input process to end")
    finally:
        signal.signal(signal.SIGCHLD, torch_s_handler)  # for the tests after this one
        del batches


def test_an_input_process_lost_as_it_hands_a_batch_over_is_named(tmp_path):
    """Killed mid-handover, an input process breaks the connection its batch's shared memory comes
    through before it can be seen dead, so torch re-raises the socket's error (in CI: a
    ConnectionResetError). Here, deterministically, the input process stops that connection's
    server (multiprocessing's resource sharer) once its batch is in the pipe, and lives on."""
    batches = iter(
        torch.utils.data.DataLoader(
            SharerStoppedAfterFirst(tmp_path), batch_size=None, num_workers=1
        )
    )
    try:
        pipe = batches._data_queue._reader  # type: ignore[attr-defined]
        wait_for(pipe.poll, 30, "the first batch in the pipe")
        (tmp_path / "in the pipe").touch()
        wait_for((tmp_path / "sharer stopped").exists, 30, "the input process to stop its sharer")
        with pytest.raises(OSError) as raised:
            next(batches)
        lost = process_group.input_processes_lost(raised.value)
        assert lost is not None and lost.startswith(
            "an input (DataLoader) process was lost as it handed a batch over ("
        ), lost
    finally:
        del batches


class SharerStoppedAfterFirst(torch.utils.data.Dataset):
    def __init__(self, signals):
        self.signals = signals

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 1:
            wait_for((self.signals / "in the pipe").exists, 30, "the first batch in the pipe")
            resource_sharer.stop()
            (self.signals / "sharer stopped").touch()
        return torch.zeros(4)


class SlowItems(torch.utils.data.Dataset):
    """Item i after `delays[i]` seconds, in the input process."""

    def __init__(self, delays: list[float]):
        self.delays = delays

    def __len__(self) -> int:
        return len(self.delays)

    def __getitem__(self, index: int) -> int:
        time.sleep(self.delays[index])
        return index


def slow_batches(
    delays: list[float],
    waits: tuple[float, float],
    stopping: Callable[[], bool] = lambda: False,
    stop_after_s: float = 0.0,
) -> DevicePrefetcher:
    """Batches of item i after delays[i] s each, waited for (first, later) seconds, and
    `stop_after_s` once `stopping()` (a stop signal came)."""
    loader = torch.utils.data.DataLoader(
        SlowItems(delays),
        batch_size=None,
        num_workers=1,
        persistent_workers=True,
        multiprocessing_context="fork",
    )
    limits = BatchWaits(*waits, stopping=stopping, stop_after_s=stop_after_s)
    return DevicePrefetcher(loader, torch.device("cpu"), as_batch, allow_empty=True, waits=limits)


def as_batch(index: int) -> Batch:
    return Batch(torch.zeros(0), torch.tensor([index]), [])


def indices(batches: DevicePrefetcher) -> list[int]:
    return [int(batch.labels) for batch in batches]


def test_the_first_batch_may_take_the_first_wait_and_each_later_one_the_later_wait():
    assert indices(slow_batches([2.5, 0.0, 0.3, 0.0], waits=(6.0, 2.0))) == [0, 1, 2, 3]


def test_a_timer_of_someone_elses_is_left_alone_and_untimed_then():
    signal.setitimer(signal.ITIMER_REAL, 100.0)
    try:
        assert indices(slow_batches([0.0, 0.6], waits=(0.3, 0.3))) == [0, 1]
        assert 90 < signal.getitimer(signal.ITIMER_REAL)[0] <= 100
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def test_off_the_main_thread_a_pass_is_untimed():
    got: list[list[int]] = []
    thread = threading.Thread(
        target=lambda: got.append(indices(slow_batches([0.0, 0.6], waits=(0.3, 0.3))))
    )
    thread.start()
    thread.join(30)
    assert got == [[0, 1]]


@pytest.mark.parametrize(
    ("delays", "waits", "late"),
    [([0.6, 0.0], (0.3, 5.0), "0.3 s"), ([0.0, 0.0, 1.0], (5.0, 0.5), "0.5 s")],
    ids=["first", "later"],
)
def test_a_batch_later_than_its_wait_ends_the_run_naming_the_flags(delays, waits, late):
    with pytest.raises(PeerLost, match=f"no batch came .* in {late}: .*--timeout"):
        indices(slow_batches(delays, waits))
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_a_stopped_input_process_ends_the_next_pass_as_it_starts():
    """A persistent loader's next pass (an epoch, an evaluation) begins with each input process
    answering; a stopped one never did, and the training process waited there without end (the
    red-team's run of one process, stopped at an epoch's end)."""
    others = set(children(os.getpid()))
    batches = slow_batches([0.0, 0.0], waits=(5.0, 0.5))
    assert indices(batches) == [0, 1]
    (stopped,) = set(children(os.getpid())) - others
    os.kill(stopped, signal.SIGSTOP)
    try:
        with pytest.raises(PeerLost, match="in 0.5 s"):
            indices(batches)
    finally:
        os.kill(stopped, signal.SIGCONT)  # the loader then ends it as ever


def test_a_job_stopped_and_continued_by_its_shell_goes_on():
    """Ctrl-Z, then fg: the whole job (this process and its input process) stopped for longer
    than the wait for a batch, by another process, while this one waits. Timed by the wall
    clock, the wait failed as the job was continued (PeerLost, blaming the input processes)."""
    batches = slow_batches([1.5], waits=(4.0, 4.0))
    shell = subprocess.Popen(
        [sys.executable, "-c", STOP_AND_CONTINUE, str(os.getpid()), "0.5", "6"],
    )
    try:
        assert indices(batches) == [0]
    finally:
        assert shell.wait(30) == 0


# A shell's Ctrl-Z and fg: argv PID, DELAY, STOPPED: after DELAY s, SIGSTOP to PID and its
# children (this one aside), SIGCONT to them STOPPED s later.
STOP_AND_CONTINUE = """
import os, signal, sys, time
pid, delay, stopped = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
time.sleep(delay)
with open(f"/proc/{pid}/task/{pid}/children") as file:
    job = [pid, *(int(child) for child in file.read().split() if int(child) != os.getpid())]
try:
    for member in job:
        os.kill(member, signal.SIGSTOP)
    time.sleep(stopped)
finally:
    for member in reversed(job):
        os.kill(member, signal.SIGCONT)
"""


@pytest.mark.parametrize("stop_after_s", [0.0, 1.0])
def test_a_stop_signal_ends_a_wait_for_a_stopped_input_process(stop_after_s):
    """With no limit to speak of (--timeout inf), a training process waited for a stopped (or
    stuck) input process without end, a stop signal or not. The input processes are ended as it
    stops waiting, all at once (the loader's shutdown waited 5 s for each in turn)."""
    others = set(children(os.getpid()))
    signalled: list[bool] = []
    batches = slow_batches([0.0, 0.0], (600.0, 600.0), lambda: bool(signalled), stop_after_s)
    assert indices(batches) == [0, 1]
    (stopped,) = set(children(os.getpid())) - others
    os.kill(stopped, signal.SIGSTOP)  # the next pass waits for it to answer
    signalled.append(True)
    torch_s_handler = signal.getsignal(signal.SIGCHLD)  # end_input_processes sets it aside
    try:
        with pytest.raises(StopWhileWaiting) as stopped_waiting:
            indices(batches)
        assert stopped_waiting.value.waited_s > stop_after_s  # the ticks counted
        assert stopped not in children(os.getpid())
    finally:
        signal.signal(signal.SIGCHLD, torch_s_handler)
        with contextlib.suppress(ProcessLookupError):
            os.kill(stopped, signal.SIGCONT)


def test_a_stopped_input_process_is_ended_cleanly():
    """END_SIGNAL waits while its receiver is stopped: SIGCONT with it, and the input process
    exits through its finalizers (its LevelDB snapshot removed) instead of SIGKILL's after 3 s."""
    fork = multiprocessing.get_context("fork")
    started = fork.Event()
    child = fork.Process(target=an_input_process_that_waits, args=(started,), daemon=True)
    child.start()
    assert started.wait(30) and child.pid is not None
    os.kill(child.pid, signal.SIGSTOP)
    torch_s_handler = signal.getsignal(signal.SIGCHLD)  # end_input_processes sets it aside
    try:
        end_input_processes()
    finally:
        signal.signal(signal.SIGCHLD, torch_s_handler)  # for the tests after this one
    assert child.exitcode == 0


def an_input_process_that_waits(started) -> None:
    start_input_process(0)
    started.set()
    time.sleep(60)


def hand_over_past_the_open_file_limit(queue, received) -> None:
    """An input process whose limit on open files is reached as it hands over a tensor: sharing
    its storage needs one more file descriptor."""
    start_input_process(0)
    # The lowest number free: a new descriptor takes it, and a limit there refuses it (after a
    # suite's other tests the open ones have gaps, where a limit of their count left room).
    listed = [int(fd) for fd in os.listdir("/proc/self/fd")]
    opened = {fd for fd in listed if is_open(fd)}  # the listing's own is closed by now
    lowest_free = min(set(range(len(opened) + 1)) - opened)
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (lowest_free, hard))
    queue.put((7, torch.arange(3)))
    received.wait(30)


def test_a_batch_an_input_process_cannot_hand_over_arrives_as_its_error():
    """multiprocessing's queue printed the error and dropped the batch, and the training process
    waited for it until its timeout (a run of --num_workers 2 under ulimit -n 36: 20 minutes)."""
    context = multiprocessing.get_context("fork")
    queue, received = context.Queue(), context.Event()
    sender = context.Process(target=hand_over_past_the_open_file_limit, args=(queue, received))
    sender.start()
    try:
        index, sent = queue.get(timeout=30)
    finally:
        received.set()
        sender.join(30)
    assert index == 7 and isinstance(sent, ExceptionWrapper)
    with pytest.raises((OSError, RuntimeError)) as raised:  # its storage's object, or descriptor
        sent.reraise()
    assert shortage_in(raised.value) == (
        f"the limit on open files (ulimit -n) of {resource.getrlimit(resource.RLIMIT_NOFILE)[0]} "
        "was reached: raise it (ulimit -n 4096; docker run --ulimit nofile=4096)"
    )


LOADER_PAST_THE_OPEN_FILE_LIMIT = """
import gc, os, resource, sys, torch
from resnet50_trainer.data.formats.databases import read_keys
from resnet50_trainer.data.input_pipeline import device_batches
from resnet50_trainer.limits import shortage_in
from resnet50_trainer.train.inputs import input_settings
from tests.support.trainer_runs import SMALL_RUN, config_of
db = sys.argv[1]
settings = input_settings(config_of(*SMALL_RUN, "--train_data", db, "--num_workers", "2"), False)
keys = read_keys(db, "lmdb")
batches = device_batches(db, "lmdb", keys, [[0, 1]], torch.device("cpu"), settings, False)
opened = len(os.listdir("/proc/self/fd")) - 1  # less the listing's own
resource.setrlimit(resource.RLIMIT_NOFILE, (opened, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
try:
    iter(batches)
except OSError as error:
    print(shortage_in(error))
gc.collect()
"""


def test_input_processes_that_cannot_start_leave_no_traceback(tmp_path):
    """The DataLoader's iterator, its start failed part way (its first queue not made), raised
    again in its __del__ on what it never made: 'Exception ignored in ... __del__', a traceback
    after the run's line."""
    db = write_image_db(str(tmp_path / "db"), 4, 2)
    done = run_python(LOADER_PAST_THE_OPEN_FILE_LIMIT, db)
    assert done.stdout.startswith("the limit on open files (ulimit -n) of"), done.stderr
    assert "Exception ignored" not in done.stderr and "Traceback" not in done.stderr
