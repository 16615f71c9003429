"""Machines with their own addresses on one Linux host: network namespaces joined by a bridge.

    from benchmarks.network_namespaces import NamespaceNetwork, namespaces_unavailable, seated

    if (reason := namespaces_unavailable()) is None:
        with NamespaceNetwork(("m0", "m1", "redis")) as net:
            net.address("m0")     # "10.231.7.1": the machine's own IPv4 address
            net.interface("m0")   # "eth_m0": its one link (each machine's has another name)
            subprocess.Popen(net.command("m0", ["python", "-m", "resnet50_trainer", ...]))
            net.link_down("m1")   # the cable of m1 pulled: its packets are dropped, no reset
            net.link_up("m1")     # and plugged back

    with seated(2, on_machines=True) as seats:  # a benchmark's 2 processes, a machine each
        mp.spawn(worker, (seats, free_port(), ...), nprocs=2)  # each: join_gloo_group(seats, ...)

Each name gets a namespace `r50t<pid>x<n>_<name>` with its loopback up and one end of a veth
pair, `eth_<name>`, holding address 10.231.<pid % 250>.<index + 1>/24; the other end is a port of
a bridge in a hub namespace `r50t<pid>x<n>_hub`. Nothing is added to the root namespace: the
subnet cannot clash with the host's routes, and two sessions' networks never meet (the pid and the
count n of networks made in this process only keep the namespace names apart). `link_down` takes
the hub's end down: the machine's interface keeps its address but loses its carrier, as when its
cable is pulled; the others' packets to it are dropped without a word (no reset). The files stay
shared (`ip netns exec` changes only the network), so a directory still serves as the machines'
shared disk. `seated` and `places` seat the processes of a benchmark: on loopback, or one a
machine, each moving itself into its namespace (`Place.enter`, the first thing it does;
`join_gloo_group` does that and forms the benchmark's Gloo group). Leaving
the `with` block, or an error inside it, removes every namespace; namespaces left by a session
that was killed (its pid no longer alive) are removed when the next one starts.
Needs root and iproute2 (`ip`).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import re
import socket
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

PREFIX = "r50t"
HUB = "hub"
BRIDGE = "br0"
CLONE_NEWNET = 0x40000000  # <sched.h>: setns joins a network namespace
_NAME = re.compile(r"[a-z0-9]{1,10}")  # interface names ("eth_" + name) have 15 characters at most
_OURS = re.compile(rf"({PREFIX}(\d+)x\d+)_\w+")
_sequence = itertools.count()
_live_prefixes: set[str] = set()  # this process's open networks


class NamespaceNetwork:
    """One namespace a name, all on one private /24; a context manager (see the module's text)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = list(names)
        bad = [name for name in self.names if not _NAME.fullmatch(name) or name == HUB]
        if bad or len(set(self.names)) != len(self.names) or not 0 < len(self.names) < 254:
            raise ValueError(f"names must be distinct, 1-10 of a-z0-9, not {HUB!r}: {self.names}")
        self.prefix = f"{PREFIX}{os.getpid()}x{next(_sequence)}"
        self.subnet = f"10.231.{os.getpid() % 250}"

    def __enter__(self) -> NamespaceNetwork:
        remove_stale_namespaces()
        _live_prefixes.add(self.prefix)
        try:
            hub = self.namespace(HUB)
            _ip("netns", "add", hub)
            _ip("-n", hub, "link", "add", BRIDGE, "type", "bridge")
            _ip("-n", hub, "link", "set", BRIDGE, "up")
            for name in self.names:
                self._plug_in(name)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exception: object) -> None:
        self.close()

    def _plug_in(self, name: str) -> None:
        namespace, hub = self.namespace(name), self.namespace(HUB)
        _ip("netns", "add", namespace)
        _ip("-n", namespace, "link", "set", "lo", "up")
        port = _hub_port(name)
        _ip("-n", hub, "link", "add", port, "type", "veth", "peer", "name", self.interface(name))
        _ip("-n", hub, "link", "set", self.interface(name), "netns", namespace)
        _ip("-n", hub, "link", "set", port, "master", BRIDGE, "up")
        _ip("-n", namespace, "addr", "add", f"{self.address(name)}/24", "dev", self.interface(name))
        _ip("-n", namespace, "link", "set", self.interface(name), "up")

    def namespace(self, name: str) -> str:
        return f"{self.prefix}_{name}"

    def address(self, name: str) -> str:
        return f"{self.subnet}.{self.names.index(name) + 1}"

    def interface(self, name: str) -> str:
        return f"eth_{name}"

    def command(self, name: str, argv: Sequence[str]) -> list[str]:
        """`argv` run on machine `name`: inside its namespace, as the calling user."""
        return ["ip", "netns", "exec", self.namespace(name), *argv]

    def link_down(self, name: str) -> None:
        _ip("-n", self.namespace(HUB), "link", "set", _hub_port(name), "down")

    def link_up(self, name: str) -> None:
        _ip("-n", self.namespace(HUB), "link", "set", _hub_port(name), "up")

    def close(self) -> None:
        """Remove every namespace of this network (with them, their links and the bridge)."""
        for name in [*self.names, HUB]:
            _remove(self.namespace(name))
        _live_prefixes.discard(self.prefix)


@dataclass(frozen=True)
class Place:
    """Where one process of a benchmark runs: its network namespace (None: the host's own), the
    interface Gloo sends on and its address there, and the address of rank 0's store."""

    namespace: str | None
    interface: str
    address: str
    store_address: str

    def enter(self) -> None:
        """Move this process into the namespace: its sockets, and those of the threads it starts
        from now on (Gloo's, the store's), are then the machine's. Call it before any of them."""
        if self.namespace is not None:
            libc = ctypes.CDLL(None, use_errno=True)
            with open(f"/run/netns/{self.namespace}") as handle:
                if libc.setns(handle.fileno(), CLONE_NEWNET):
                    raise OSError(ctypes.get_errno(), f"setns into {self.namespace}")
        os.environ["GLOO_SOCKET_IFNAME"] = self.interface


def places(processes: int, net: NamespaceNetwork | None = None) -> list[Place]:
    """One Place a process: all on loopback, or (with `net`) one on each of its machines in turn."""
    if net is None:
        return [Place(None, "lo", "127.0.0.1", "127.0.0.1")] * processes
    if processes > len(net.names):
        raise ValueError(f"{processes} processes, {len(net.names)} machines")
    seats = net.names[:processes]
    store = net.address(seats[0])
    return [Place(net.namespace(n), net.interface(n), net.address(n), store) for n in seats]


@contextlib.contextmanager
def seated(processes: int, on_machines: bool) -> Iterator[list[Place]]:
    """places(processes): all on loopback, or one on each machine of a NamespaceNetwork made for
    the `with` block (m0, m1, ...)."""
    if not on_machines:
        yield places(processes)
        return
    with NamespaceNetwork(f"m{index}" for index in range(processes)) as net:
        yield places(processes, net)


def join_gloo_group(seats: Sequence[Place], rank: int, port: int) -> None:
    """Process `rank` of len(seats) moves onto its seat and joins a Gloo group whose store rank 0
    serves on `port` (free_port()) at its address."""
    from datetime import timedelta

    import torch.distributed as dist

    seats[rank].enter()
    world_size = len(seats)
    store = dist.TCPStore(seats[rank].store_address, port, world_size, is_master=rank == 0)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=600)
    )


def free_port() -> int:
    """A port free on this host's loopback; a fresh namespace has every port free."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _hub_port(name: str) -> str:
    return f"p_{name}"


def namespaces_unavailable() -> str | None:
    """Why namespaces cannot be made here (not root, no iproute2, refused), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"{PREFIX}{os.getpid()}x{next(_sequence)}_probe"
    try:
        made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    except FileNotFoundError:
        return "network namespaces need iproute2's ip command"
    if made.returncode:
        return f"ip netns add refused: {made.stderr.strip()}"
    _remove(probe)
    return None


def remove_stale_namespaces() -> None:
    """Remove the namespaces of networks whose session is gone: its pid is no longer alive, or is
    this process's (reused) without a network of that name open here."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        ours = _OURS.fullmatch(line.split()[0]) if line.strip() else None
        if ours is None or ours.group(1) in _live_prefixes:
            continue
        pid = int(ours.group(2))
        if pid == os.getpid() or not os.path.exists(f"/proc/{pid}"):
            _remove(ours.group(0))


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _remove(namespace: str) -> None:
    """Deleting a namespace deletes its interfaces, and a veth pair dies with either end."""
    subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)
