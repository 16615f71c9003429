"""This machine's limits as the kernel shows them to this process: its rlimits, what it maps, the
memory and pids limits of its cgroup (v1 or v2) and their ancestors, the room in /dev/shm; the
OOM killer's count of kills and this process's place in its order; what torch left in /dev/shm
for processes that have ended, removed. Torch-free: the commands read it before they import
torch (limits.py names what a limit caused)."""

from __future__ import annotations

import contextlib
import glob
import math
import os
import re
import resource
from collections.abc import Iterable
from typing import NamedTuple

# Where shm_open puts its objects (glibc): torch's shared tensors and multiprocessing's semaphores.
SHARED_MEMORY = "/dev/shm"
# A v1 memory cgroup without a limit shows the largest page-aligned number it stores.
_NO_V1_LIMIT = 1 << 62
# What a training process adds to its oom_score_adj (first_for_the_oom_killer): half the scale,
# more than the launcher or the fork server (torch imported, ~0.7 GB resident) can weigh in any
# limit a run fits in; the kernel's maximum.
OOM_SCORE_RAISE = 500
OOM_SCORE_ADJ_MAX = 1000
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


def remove_shared_memory_of(pids: Iterable[int]) -> None:
    """Remove what torch left in /dev/shm for processes `pids`, which have ended: an object whose
    allocation failed (/dev/shm full) keeps its name there; the others were unlinked as made."""
    for pid in pids:
        for path in glob.glob(os.path.join(SHARED_MEMORY, f"torch_{pid}_*")):
            with contextlib.suppress(OSError):
                os.unlink(path)


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
