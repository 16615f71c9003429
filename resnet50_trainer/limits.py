"""What a limit of the machine did, named as such (machine.py reads the limits): an error that one
of them caused (shared memory, open files, file size, processes and threads, address space,
memory) in one clause saying which limit, how large it is, and how to raise it; a limit the start
finds too small for the run, in the same words; how a process killed by a signal died (the OOM
killer, a crash). Errors are read by their errno and their words, as the OS, torch and LMDB word
them (an input process's error reaches its training process as text). Torch-free: the commands
use it before they import torch, and resnet50-db's tools too."""

from __future__ import annotations

import errno
import math
import os
import re
import resource
import signal
import sys
import traceback
from collections.abc import Callable, Iterator

from resnet50_trainer.machine import (
    SHARED_MEMORY,
    Mapping,
    in_units,
    mapping_limits,
    memory_limit,
    oom_killed_since,
    shared_memory_room,
    soft_limit,
    task_limits,
    tightest_mapping_limit,
)

# How to raise each limit, where the run's machine is a container or a job (docs/many-machines.md,
# Limits of the machine).
SHARED_MEMORY_FIX = (
    "give it more room (docker run --shm-size 2g; on Kubernetes an emptyDir of medium Memory "
    "mounted on /dev/shm) or use fewer --num_workers (0 uses none)"
)
OPEN_FILES_FIX = "raise it (ulimit -n 4096; docker run --ulimit nofile=4096)"
FILE_SIZE_FIX = "raise it or remove it (ulimit -f unlimited)"
TASKS_FIX = "raise it (ulimit -u; docker run --pids-limit; Kubernetes' podPidsLimit)"
MEMORY_FIX = (
    "lower --batch_size or --num_workers, or give the run more memory (docker run --memory, "
    "Slurm's --mem, Kubernetes' resources.limits.memory)"
)
# The signals of a crash in native code (as the kernel sends them, or abort()).
_CRASHES = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT)
# The limits of a process the start checks besides those on what it maps, in words: what each
# limits, its ulimit flag, how a value reads, what of it the run needs, and the fix.
_RLIMITS: dict[int, tuple[str, str, Callable[[float], str], str, str]] = {
    resource.RLIMIT_NOFILE: (
        "open files",
        "ulimit -n",
        str,
        "a training process opens",
        OPEN_FILES_FIX,
    ),
    resource.RLIMIT_FSIZE: (
        "file size",
        "ulimit -f",
        in_units,
        "a checkpoint of this run takes",
        FILE_SIZE_FIX,
    ),
}


def shortage_in(error: BaseException) -> str | None:
    """The clause naming the limit `error` (or an error it came from) ran into, with the limit's
    size now and its fix; None where `error` is of another kind."""
    for cause in _chain(error):
        text = str(cause)
        code = getattr(cause, "errno", None)
        code = code if isinstance(code, int) else _errno_in(text)
        if code == errno.ENOSPC and _from_shared_memory(cause, text):
            return shared_memory_shortage()
        unusable = shared_memory_unusable()
        if code in (errno.EROFS, errno.EACCES) and unusable and _from_shared_memory(cause, text):
            return unusable
        if code == errno.EMFILE or "received 0 items of ancdata" in text:
            return rlimit_shortage(resource.RLIMIT_NOFILE)
        if code == errno.EFBIG and soft_limit(resource.RLIMIT_FSIZE) < math.inf:
            return rlimit_shortage(resource.RLIMIT_FSIZE)  # not a file system's largest file
        if code == errno.ENFILE:
            return (
                "this machine's table of open files is full (fs.file-max): raise it (sysctl "
                "fs.file-max) or end other processes"
            )
        if "can't start new thread" in text or (code == errno.EAGAIN and _from_fork(cause)):
            return tasks_shortage()
        if _out_of_memory(cause, text, code):
            return memory_shortage()
    return None


def shared_memory_shortage(needed: int | None = None) -> str:
    """Shared memory ran out, or (`needed` bytes, before the start) has too little room."""
    size, free = shared_memory_room()
    room = f"{SHARED_MEMORY}, where input processes hand their batches over, holds {in_units(size)}"
    if needed is None:
        return f"shared memory ran out: {room} ({in_units(free)} free): {SHARED_MEMORY_FIX}"
    return (
        f"shared memory is short: {room}, {in_units(free)} of it free, and this run needs about "
        f"{in_units(needed)} there: {SHARED_MEMORY_FIX}"
    )


def shared_memory_unusable() -> str | None:
    """Why this process cannot make shared memory at all (/dev/shm missing, read-only, not
    writable by its user), in one clause with the fix; None where it can."""
    why: str | None = None
    try:
        if os.statvfs(SHARED_MEMORY).f_flag & os.ST_RDONLY:
            why = "is mounted read-only"
        elif not os.access(SHARED_MEMORY, os.W_OK):
            why = "cannot be written"
    except OSError as error:
        why = f"cannot be used ({error.strerror})"
    if why is None:
        return None
    return (
        f"shared memory cannot be made: {SHARED_MEMORY}, where input processes hand their batches "
        f"over, {why}: mount a tmpfs there that this user can write (docker run --shm-size 2g; on "
        "Kubernetes an emptyDir of medium Memory) or use --num_workers 0"
    )


def rlimit_shortage(limit: int, needed: int | None = None) -> str:
    """A process's limit `limit` (resource.RLIMIT_NOFILE, RLIMIT_FSIZE) met, or (`needed`, before
    the start) below what the run needs of it."""
    what, flag, shown, needing, fix = _RLIMITS[limit]
    words = f"the limit on {what} ({flag}) of {shown(resource.getrlimit(limit)[0])}"
    return _met(words, None if needed is None else f"the about {shown(needed)} {needing}", fix)


def tasks_shortage(needed: int | None = None) -> str:
    """No thread or process could be started: the user's RLIMIT_NPROC or the cgroup's pids.max."""
    held = ", ".join(f"{limit} of {whose}, {used} in use" for whose, limit, used in task_limits())
    return _met(
        f"the limit on threads and processes ({held or 'ulimit -u, or pids.max of a cgroup'})",
        None if needed is None else f"the about {needed} more this run starts",
        TASKS_FIX,
    )


def memory_shortage() -> str:
    """Memory ran out: a limit on what a process maps, where one is set, or the cgroup's or the
    machine's memory."""
    mapping = tightest_mapping_limit()
    if mapping is None:
        return f"memory ran out ({memory_in_words()}): {MEMORY_FIX}"
    return mapping_shortage(mapping)


def mapping_shortage(mapping: Mapping, needed: int | None = None) -> str:
    maps = None if needed is None else f"the about {in_units(needed)} a training process maps"
    return _met(str(mapping), maps, mapping.fix)


def _met(limit: str, needed: str | None, fix: str) -> str:
    """A limit met as the run goes ("was reached"), or (`needed`, before the start) too small."""
    return f"{limit} {'was reached' if needed is None else f'is below {needed}'}: {fix}"


def memory_in_words() -> str:
    """The memory processes of this run may have: their cgroup's limit, or the machine's."""
    limit = memory_limit()
    if limit is not None:
        return f"the memory limit of its cgroup, {in_units(limit)}"
    return f"this machine's {in_units(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))}"


def death_in_words(signum: int, oom_kills_before: int | None) -> str:
    """How a process killed by `signum` died, and the fix where a limit was the cause: the OOM
    killer's SIGKILL (its count grew since `oom_kills_before`), or a crash in native code, which
    an address-space limit too small for the run makes likely."""
    name = signal.Signals(signum).name
    if signum == signal.SIGKILL and oom_killed_since(oom_kills_before):
        return (
            f"was killed (SIGKILL) by the kernel's OOM killer, memory having run out "
            f"({memory_in_words()}): {MEMORY_FIX}"
        )
    if signum not in _CRASHES:
        return f"was killed by {name}"
    mapping = tightest_mapping_limit()
    why = f"; {mapping} may be why: {mapping.fix}" if mapping is not None else ""
    return f"crashed in native code ({name}){why}"


def _chain(error: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        yield cause
        cause = cause.__cause__ or cause.__context__


def _errno_in(text: str) -> int | None:
    """The errno an error carries only in its words: torch's "... (28)", or the strerror of an
    OSError rebuilt from an input process's traceback (its errno lost on the way)."""
    for code in (errno.ENOSPC, errno.EFBIG, errno.ENFILE, errno.EMFILE, errno.EAGAIN, errno.ENOMEM):
        if os.strerror(code) in text:
            return code
    return None


def _frames(error: BaseException) -> traceback.StackSummary:
    return traceback.extract_tb(error.__traceback__)


def _from_shared_memory(error: BaseException, text: str) -> bool:
    """torch's shared tensors ("shared memory", their /torch_* objects) or a multiprocessing
    semaphore (SemLock), whether raised here or in an input process (then named in the text)."""
    semaphores = _code_of("multiprocessing.synchronize")
    here = any(frame.filename == semaphores for frame in _frames(error))
    return here or bool(re.search(r"shared memory|/torch_|SemLock", text))


def _from_fork(error: BaseException) -> bool:
    """Raised by a fork (os.fork, subprocess's and multiprocessing's fork_exec), by its line."""
    frames = _frames(error)
    return bool(frames) and "fork" in (frames[-1].line or "")


def _code_of(module: str) -> str | None:
    """A module's file, where it is imported (an error raised in it was, and the commands do not
    import it before they need it)."""
    return getattr(sys.modules.get(module), "__file__", None)


def _out_of_memory(error: BaseException, text: str, code: int | None) -> bool:
    """The host's memory (not a GPU's: CUDA's out-of-memory errors are the GPU's)."""
    if "CUDA" in text:
        return False
    said = re.search(r"can't allocate memory|std::bad_alloc", text)
    # Where a limit on what a process maps is set, oneDNN words a map refused only as a primitive
    # it could not create, and the dynamic loader as a library it could not map.
    refused = re.search(r"could not create a primitive|failed to map segment", text) is not None
    refused = refused and bool(mapping_limits())
    return isinstance(error, MemoryError) or code == errno.ENOMEM or bool(said) or refused
