"""The limits of the machine a command runs on (shared memory, open files, processes and threads,
address space, memory), read where the kernel shows them, and an error that one of them caused
named as such: one clause saying which limit, how large it is, and how to raise it. Errors are
read by their errno and their words, as the OS, torch and LMDB word them (an input process's
error reaches its training process as text). Torch-free: the commands use it before they import
torch, and resnet50-db's tools too."""

from __future__ import annotations

import contextlib
import errno
import glob
import math
import os
import re
import resource
import signal
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

# Where shm_open puts its objects (glibc): torch's shared tensors and multiprocessing's semaphores.
SHARED_MEMORY = "/dev/shm"
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
# A v1 memory cgroup without a limit shows the largest page-aligned number it stores.
_NO_V1_LIMIT = 1 << 62
# What a training process adds to its oom_score_adj (first_for_the_oom_killer): half the scale,
# more than the launcher or the fork server (torch imported, ~0.7 GB resident) can weigh in any
# limit a run fits in; the kernel's maximum.
OOM_SCORE_RAISE = 500
OOM_SCORE_ADJ_MAX = 1000
# The signals of a crash in native code (as the kernel sends them, or abort()).
_CRASHES = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT)
# The capabilities that exempt a process from RLIMIT_NPROC: CAP_SYS_ADMIN and CAP_SYS_RESOURCE.
_NPROC_EXEMPT = (1 << 21) | (1 << 24)


def soft_limit(limit: int) -> float:
    """This process's soft limit of resource `limit` (resource.RLIMIT_NOFILE...), inf where none
    (resource gives RLIM_INFINITY, which is -1)."""
    soft = resource.getrlimit(limit)[0]
    return math.inf if soft == resource.RLIM_INFINITY else soft


def in_units(size: float) -> str:
    """Bytes in words: "64 KiB", "1.5 GiB"."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" or size >= 100 else f"{size:.3g} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


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


def shared_memory_room() -> tuple[int, int]:
    """The size of /dev/shm and the bytes free there (for an unprivileged process)."""
    stats = os.statvfs(SHARED_MEMORY)
    return stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize


class Mapping(NamedTuple):
    """A limit on the memory this process maps, and what it maps of that kind now."""

    name: str  # "address-space"
    flag: str  # "ulimit -v"
    resource: int  # resource.RLIMIT_AS
    limit: int
    mapped: int

    def __str__(self) -> str:
        return f"the {self.name} limit ({self.flag}) of {in_units(self.limit)}"

    @property
    def fix(self) -> str:
        return f"raise it or remove it ({self.flag} unlimited)"


def mapping_limits() -> list[Mapping]:
    """The limits set on what this process maps: RLIMIT_AS (ulimit -v: all of it) and RLIMIT_DATA
    (ulimit -d: its private writable part, the heap, anonymous maps, libraries' data)."""
    status = _read("/proc/self/status") or ""
    found = []
    for name, flag, limit, field in (
        ("address-space", "ulimit -v", resource.RLIMIT_AS, "VmSize"),
        ("data-size", "ulimit -d", resource.RLIMIT_DATA, "VmData"),
    ):
        soft = resource.getrlimit(limit)[0]
        mapped = re.search(rf"^{field}:\s*(\d+) kB$", status, re.MULTILINE)
        if soft != resource.RLIM_INFINITY:
            size = int(mapped.group(1)) << 10 if mapped else 0
            found.append(Mapping(name, flag, limit, soft, size))
    return found


def tightest_mapping_limit() -> Mapping | None:
    """Of the limits on what this process maps, the one with the least room left."""
    return min(mapping_limits(), key=lambda mapping: mapping.limit - mapping.mapped, default=None)


def task_limits() -> list[tuple[str, int, int]]:
    """The limits on threads and processes that hold here, as (whose, limit, in use): the user's
    RLIMIT_NPROC (ulimit -u; counted over all the user's threads, not enforced for root or a
    process with CAP_SYS_RESOURCE or CAP_SYS_ADMIN) and the pids.max of this process's cgroup
    and its ancestors."""
    limits = []
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if nproc != resource.RLIM_INFINITY and _nproc_enforced():
        limits.append(("ulimit -u, this user's", nproc, _threads_of_this_user()))
    for directory in _cgroup_and_ancestors("pids"):
        maximum = _read(os.path.join(directory, "pids.max"))
        current = _read(os.path.join(directory, "pids.current"))
        if maximum and maximum != "max" and current:
            limits.append(("pids.max, its cgroup's", int(maximum), int(current)))
    return limits


def memory_limit() -> int | None:
    """The smallest memory limit of this process's cgroup and its ancestors, None where none."""
    limits = []
    for directory in _cgroup_and_ancestors("memory"):
        for name in ("memory.max", "memory.limit_in_bytes"):  # cgroup v2, v1
            value = _read(os.path.join(directory, name))
            if value and value != "max" and int(value) < _NO_V1_LIMIT:
                limits.append(int(value))
    return min(limits, default=None)


def oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's memory cgroup (or,
    where that cannot be read, on this machine); None where neither can be read. A count that
    grows while a process dies by SIGKILL names its killer."""
    for directory in _cgroup_and_ancestors("memory")[:1]:
        for name in ("memory.events", "memory.oom_control"):  # cgroup v2, v1
            count = _field(os.path.join(directory, name), "oom_kill")
            if count is not None:
                return count
    return _field("/proc/vmstat", "oom_kill")


def oom_killed_since(count: int | None) -> bool:
    """Whether the OOM killer has killed since oom_kills() was `count`."""
    now = oom_kills()
    return count is not None and now is not None and now > count


def first_for_the_oom_killer() -> None:
    """Raise this process's oom_score_adj by OOM_SCORE_RAISE (as any process may), for it and the
    processes it starts: when memory runs out, the kernel kills it before the launcher, the fork
    server or the watcher (launch/watcher.py) that would name its death, whichever is larger. Left
    as it is where /proc does not let it be written."""
    path = "/proc/self/oom_score_adj"
    current = _read(path)
    if current is None:
        return
    with contextlib.suppress(OSError), open(path, "w") as file:
        file.write(str(min(OOM_SCORE_ADJ_MAX, int(current) + OOM_SCORE_RAISE)))


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


def remove_shared_memory_of(pids: Iterable[int]) -> None:
    """Remove what torch left in /dev/shm for processes `pids`, which have ended: an object whose
    allocation failed (/dev/shm full) keeps its name there; the others were unlinked as made."""
    for pid in pids:
        for path in glob.glob(os.path.join(SHARED_MEMORY, f"torch_{pid}_*")):
            with contextlib.suppress(OSError):
                os.unlink(path)


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


def _nproc_enforced() -> bool:
    if os.getuid() == 0:
        return False
    status = _read("/proc/self/status") or ""
    found = re.search(r"^CapEff:\s*([0-9a-f]+)$", status, re.MULTILINE)
    return not (found and int(found.group(1), 16) & _NPROC_EXEMPT)


def _threads_of_this_user() -> int:
    """The threads of every process whose real user is this process's (what RLIMIT_NPROC counts)."""
    uid, count = str(os.getuid()), 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        status = _read(f"/proc/{pid}/status") or ""
        user = re.search(r"^Uid:\s*(\d+)", status, re.MULTILINE)
        threads = re.search(r"^Threads:\s*(\d+)", status, re.MULTILINE)
        if user and threads and user.group(1) == uid:
            count += int(threads.group(1))
    return count


def _cgroup_and_ancestors(controller: str) -> list[str]:
    """This process's cgroup folder for `controller` ("memory", "pids"; cgroup v1 or v2) and its
    ancestors up to the mount's root; none where no cgroup file system shows it."""
    found = _cgroup_folder(controller)
    if found is None:
        return []
    folder, mountpoint = found
    folders = [folder]
    while folders[-1] != mountpoint:
        folders.append(os.path.dirname(folders[-1]))
    return folders


def _cgroup_folder(controller: str) -> tuple[str, str] | None:
    """(this process's cgroup folder for `controller`, its mount point). The path in
    /proc/self/cgroup is the hierarchy's; a mount shows it from its root (/proc/self/mountinfo),
    which in a container is the container's cgroup. Under cgroup v2 a folder has the controller
    only where its parent enables it (its files are there: pids.max, memory.max)."""
    mounts = [line.split(" - ") for line in (_read("/proc/self/mountinfo") or "").splitlines()]
    for membership in (_read("/proc/self/cgroup") or "").splitlines():
        hierarchy, controllers, path = membership.split(":", 2)
        v2 = hierarchy == "0" and not controllers
        if not v2 and controller not in controllers.split(","):
            continue
        for fields, described in (mount for mount in mounts if len(mount) == 2):
            fstype, _, options = (described.split() + ["", ""])[:3]
            root, mountpoint = fields.split()[3:5]
            shown = (path + "/").startswith(root.rstrip("/") + "/")
            if fstype == ("cgroup2" if v2 else "cgroup") and shown:
                if v2 or controller in options.split(","):
                    folder = os.path.join(mountpoint, path[len(root) :].lstrip("/")).rstrip("/")
                    if not v2 or os.path.exists(os.path.join(folder, f"{controller}.max")):
                        return folder, mountpoint.rstrip("/") or "/"
    return None


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read().strip()
    except OSError:
        return None


def _field(path: str, name: str) -> int | None:
    """The number after `name` on its line of a "name value" file (memory.events, /proc/vmstat)."""
    found = re.search(rf"^{name} (\d+)$", _read(path) or "", re.MULTILINE)
    return int(found.group(1)) if found else None
