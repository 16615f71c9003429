"""Every use of CPython's private APIs (undocumented modules, functions and attributes, and the
words of its warnings), here and nowhere else: the one file to audit on each Python upgrade. Each
function says what it relies on and the CPython versions that was checked against: "3.11" is the
library the tests run on; "main" is CPython's main-branch source as read (2025); ranges in quotes
are earlier readings.

On an upgrade, check too where the default start method counts: 3.14 makes it forkserver on Linux
(it was fork). The input processes ask for fork by name (data/input_pipeline.py) and the launcher
for its start method (launch/processes.py); tools/db/build.py's pool takes the default, and its
workers would then start afresh instead of as forks (its signal handling assumes a fork).

multiprocessing.util registers its exit handler with atexit as it is imported (forkserver,
resource_tracker and queues import it): each is imported where used, so that a command that never
starts a process (--help, resnet50-db) registers nothing. Torch-free."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import signal
import sys
from collections.abc import Callable, Iterable
from typing import Any

# The longest path a Unix socket takes (sun_path, less its NUL), and what multiprocessing adds to
# the temporary directory's base for one.
SOCKET_PATH_MAX = 107
SOCKET_IN_TEMPORARY_DIRECTORY = "/pymp-XXXXXXXX/listener-XXXXXXXX"


def run_exit_handlers() -> None:
    """atexit._run_exitfuncs: this process's exit handlers now (multiprocessing's, logging's,
    tqdm's), without the interpreter's teardown. Checked: 3.11, main (and "3.8 to 3.14")."""
    atexit._run_exitfuncs()


def finalize_at_multiprocessing_exit(
    owner: object | None,
    callback: Callable[..., object],
    args: tuple[Any, ...] = (),
    *,
    exitpriority: int,
) -> Callable[[], object]:
    """multiprocessing.util.Finalize: `callback(*args)` once, when `owner` is collected, when the
    returned finalizer is called, or at exit by multiprocessing's exit handler (highest
    `exitpriority` first; those of 0 and more before it SIGTERMs its daemonic children). That
    handler runs where atexit's do not: in a process multiprocessing started, which ends with
    os._exit. Checked: 3.11, main (signature unchanged since 2.6)."""
    import multiprocessing.util

    return multiprocessing.util.Finalize(owner, callback, args=args, exitpriority=exitpriority)


def own_temporary_directory() -> None:
    """multiprocessing's temporary directory, where input processes put the socket they pass file
    descriptors through, becomes this process's own: made now, so that the input processes it
    forks share it, and removed as it ends, after them (a process killed -9 leaves it, as any
    Python process does). Inherited, it was the launcher's, removed as the launcher ended: input
    processes orphaned by a killed fork server then each printed a FileNotFoundError traceback.
    In /tmp where TMPDIR is too long for a socket's path (as Python 3.14 does, gh-132124): input
    processes could not hand over a batch (tracebacks, and no step). Where none can be made, the
    launcher's serves. CPython keeps it in the process's private _config, made by
    multiprocessing.util.get_temp_dir with the socket's names above. Checked: 3.11, main (and
    "3.8 to 3.14")."""
    import multiprocessing.util
    import tempfile

    settings = multiprocessing.current_process()._config  # type: ignore[attr-defined]
    inherited = settings.pop("tempdir", None)
    chosen = tempfile.tempdir
    base = tempfile.gettempdir()
    if len(base) + len(SOCKET_IN_TEMPORARY_DIRECTORY) > SOCKET_PATH_MAX:
        tempfile.tempdir = "/tmp"
    try:
        multiprocessing.util.get_temp_dir()
    except OSError:
        settings["tempdir"] = inherited
    finally:
        tempfile.tempdir = chosen


def quiet_resource_tracker_warnings() -> None:
    """multiprocessing's resource tracker (started later, with this interpreter's -W options)
    cleans up the semaphores of an input or training process that was killed, and would warn
    of each such "leak" at the end of the run: after a kill -9 the run's line is the report.
    Relies on its warnings' words starting "resource_tracker". Checked: 3.11, main."""
    sys.warnoptions.append("ignore:resource_tracker:UserWarning")


def start_resource_tracker(keep_blocked: Iterable[signal.Signals]) -> None:
    """Start multiprocessing's resource tracker (multiprocessing.resource_tracker.ensure_running),
    which the context's first lock or process would start, and block `keep_blocked` again:
    starting it unblocks SIGINT and SIGTERM in this thread (CPython's guard against bpo-33613
    ends with SIG_UNBLOCK, not the mask it found), so the children would start with SIGTERM
    unblocked and die by one sent before they record it. Checked: 3.11, main."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    signal.pthread_sigmask(signal.SIG_BLOCK, tuple(keep_blocked))


def start_fork_server(preload: list[str]) -> None:
    """multiprocessing's fork server started now (multiprocessing.forkserver.ensure_running),
    importing the modules `preload` names first; OSError where it cannot start. Checked: 3.11,
    main."""
    from multiprocessing import forkserver

    forkserver.set_forkserver_preload(preload)
    forkserver.ensure_running()


def stop_fork_server() -> None:
    """This process's fork server stopped, once every process it started has ended (it waits for
    them): a later one in this process starts afresh, with the environment and standard streams
    it has then. CPython's own stop, which its tests use (forkserver._forkserver._stop); nothing
    where a Python lacks it. Checked: 3.11, main."""
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is not None:
        with contextlib.suppress(OSError):  # its socket's folder already gone: nothing to undo
            stop()


def let_the_fork_server_go() -> None:
    """CPython gives each process the fork server starts the write end of the server's 'alive'
    pipe (so that it may start processes too), and the server ends only once every holder has
    closed it. A process that starts none from it closes it here: its own children (forked
    input processes) would inherit it, and one that outlives it (stopped, or stuck in a read)
    kept the server, and whoever waits for it, from ever ending (red-team). A process not started
    by a fork server holds none. Relies on forkserver._forkserver._forkserver_alive_fd. Checked:
    3.11, main (and "3.8 to 3.14")."""
    from multiprocessing import forkserver

    server = forkserver._forkserver
    alive = getattr(server, "_forkserver_alive_fd", None)
    if alive is not None:
        os.close(alive)
        setattr(server, "_forkserver_alive_fd", None)  # noqa: B010 (private: typeshed lacks it)


def hand_unsent_queue_items_to(hook: Callable[[Any, Exception, object], None]) -> None:
    """`hook(queue, error, item)` is what this process's multiprocessing queues do with an item
    their feeder thread could not send, where CPython prints a traceback and drops it
    (report_unsent_as_cpython_does). A class attribute, looked up as a queue's feeder thread
    starts: Queue._on_queue_feeder_error, the hook CPython keeps for concurrent.futures to
    override. Checked: 3.11, main."""
    import multiprocessing.queues

    _cpythons_unsent_item_report()  # kept before it is replaced
    setattr(multiprocessing.queues.Queue, "_on_queue_feeder_error", hook)  # noqa: B010


def report_unsent_as_cpython_does(error: Exception, item: object) -> None:
    _cpythons_unsent_item_report()(error, item)


@functools.cache
def _cpythons_unsent_item_report() -> Callable[[Exception, object], None]:
    import multiprocessing.queues

    return multiprocessing.queues.Queue._on_queue_feeder_error  # type: ignore[attr-defined]


def in_resource_sharer(filename: str) -> bool:
    """Whether code of `filename` is multiprocessing's resource sharer, the thread that hands a
    shared-memory block or a file descriptor to another process (multiprocessing.resource_sharer,
    undocumented). Checked: 3.11, main."""
    from multiprocessing import resource_sharer

    return filename == resource_sharer.__file__
