"""Two machines with addresses of their own, each a Linux network namespace of this host
(benchmarks/network_namespaces.py), of two CPU processes each: they meet through Redis on a third
machine or through a shared directory, over the interface named by --distributed_interfaces, and
train alike. A machine's link taken down mid-epoch or during the meeting ends both machines, each
in one line naming the machine it lost; Redis out of reach once the machines met costs the run
nothing. Skipped where namespaces cannot be made (not root, no iproute2)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from benchmarks.network_namespaces import (  # the helper is shared with the benchmarks
    NamespaceNetwork,
    Place,
    join_gloo_group,
    namespaces_unavailable,
    seated,
)
from tests.support.redis_server import free_port, running_redis
from tests.support.trainer_runs import one_error_line, trainer_command, trainer_env
from tests.system.test_distributed import assert_trained_one_pass, finish, start, train_db  # noqa: F401 (fixture)

TIMEOUT_S = 10  # --timeout: how long a collective waits on a silent peer
NOTICE_S = 30  # what noticing may add to it: the roll call of peers, leaving, a loaded machine
MACHINES = ("m0", "m1")


@pytest.fixture
def network():
    reason = namespaces_unavailable()
    if reason is not None:
        pytest.skip(reason)
    with NamespaceNetwork((*MACHINES, "redis")) as net:
        yield net


def namespaces() -> list[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def test_a_killed_session_s_namespaces_go_when_the_next_starts_and_its_own_on_leaving(network):
    finished = subprocess.Popen(["true"])
    finished.wait()  # its pid is no longer alive: as a session that was killed
    stale = f"r50t{finished.pid}x0_m0"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    with NamespaceNetwork(["a"]) as other:
        assert stale not in namespaces() and other.namespace("a") in namespaces()
        assert network.namespace("m0") in namespaces()  # a live network of this process stays
    assert other.namespace("a") not in namespaces()


def all_reduce_on_seats(rank: int, seats: list[Place], port: int, results) -> None:
    """A benchmark's process: on its machine, it sums its rank with the other's over Gloo."""
    import torch
    import torch.distributed as dist

    join_gloo_group(seats, rank, port)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    results.put((rank, sorted(name for _, name in socket.if_nameindex()), total.item()))
    dist.destroy_process_group()


@pytest.mark.parametrize("on_machines", [False, True], ids=["loopback", "namespaces"])
def test_a_benchmark_s_processes_sit_on_their_machines_and_reach_each_other(on_machines):
    """The benchmarks' seats (benchmarks/compression.py, scaling_calibration.py): each
    spawned process moves into its machine's namespace, where it sees only that machine's
    interface, and the two all-reduce across the bridge."""
    if on_machines and (reason := namespaces_unavailable()):
        pytest.skip(reason)
    import torch.multiprocessing as mp

    results = mp.get_context("spawn").SimpleQueue()
    with seated(2, on_machines) as seats:
        mp.spawn(all_reduce_on_seats, (seats, free_port(), results), nprocs=2)
        if on_machines:
            assert seats[1].store_address == seats[0].store_address != "127.0.0.1"
    seen = {rank: (interfaces, total) for rank, interfaces, total in (results.get(), results.get())}
    for rank, (interfaces, total) in seen.items():
        assert total == 3.0
        if on_machines:
            assert interfaces == [f"eth_m{rank}", "lo"]


def start_machine(net: NamespaceNetwork, tmp_path, machine: str, *flags: str):
    """Shard `machine` of 2 (2 processes), run inside its namespace and on its own interface."""
    return start(
        tmp_path,
        machine,
        *("--num_gpus", "2", "--num_shards", "2", "--shard_id", str(MACHINES.index(machine))),
        *("--distributed_interfaces", net.interface(machine), *flags),
        launcher=net.command(machine, [sys.executable]),
    )


def start_both(net: NamespaceNetwork, tmp_path, *flags: str):
    """Shard 1 first (it waits for shard 0's address), then shard 0; returns (shard 0, shard 1)."""
    shard_1 = start_machine(net, tmp_path, "m1", *flags)
    return start_machine(net, tmp_path, "m0", *flags), shard_1


def read_until(process, text: str, limit_s: float = 120) -> None:
    """Reads the process's output up to the line holding `text`; fails on its end or the limit."""
    deadline, seen = time.monotonic() + limit_s, []
    while text not in (line := process.stdout.readline()):
        seen.append(line)
        if not line or time.monotonic() > deadline:
            raise AssertionError(f"never printed {text!r}:\n{''.join(seen)}")


def through_a_directory(tmp_path, run_id: str) -> list[str]:
    meeting = tmp_path / "nfs"
    meeting.mkdir()
    return ["--run_id", run_id, "--file_store_path", str(meeting)]


def test_two_machines_meet_through_redis_on_a_third_which_may_then_go(
    network,
    tmp_path,
    train_db,  # noqa: F811
):
    """Redis carries only the meeting: its link taken down once the machines met, the run trains
    to its end; shard 0 leaves its entry there, named in a warning."""
    redis_address = network.address("redis")
    # Protected mode (no password) would refuse every machine but its own.
    serve = running_redis(
        "--protected-mode", "no", bind=redis_address, prefix=network.command("redis", [])
    )
    with serve as port:
        shard_0, shard_1 = start_both(
            network,
            tmp_path,
            *("--train_data", train_db, "--run_id", "ns1"),
            *("--redis_host", redis_address, "--redis_port", str(port)),
        )
        read_until(shard_0, f"All 2 shards of run ns1 met at {network.address('m0')}:")
        network.link_down("redis")
        output = assert_trained_one_pass(shard_0, [shard_1])
    assert f"The run's entry stays in redis {redis_address}:{port}" in output


def test_two_machines_meet_through_a_shared_directory(network, tmp_path, train_db):  # noqa: F811
    meeting = through_a_directory(tmp_path, "ns2")
    shard_0, shard_1 = start_both(network, tmp_path, "--train_data", train_db, *meeting)
    output = assert_trained_one_pass(shard_0, [shard_1])
    assert f"All 2 shards of run ns2 met at {network.address('m0')}:" in output


def test_another_machine_s_interface_is_refused_in_one_line(network, tmp_path):
    command = trainer_command(
        *("--train_data", "null", "--num_shards", "2", "--shard_id", "0", "--run_id", "ns3"),
        *("--file_store_path", str(tmp_path), "--distributed_interfaces", "eth_m1"),
    )
    done = subprocess.run(
        network.command("m0", command), env=trainer_env(), capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert one_error_line(done.stderr).endswith(
        "--distributed_interfaces names eth_m1, not a network interface of this machine "
        "(it has: eth_m0, lo)"
    )


def lost_lines(processes, noticed_from: float, within_s: float) -> list[str]:
    """Each machine's one error line, once it ended by itself within `within_s`: exit 1 or 2."""
    lines = []
    for process in processes:
        code, output = finish(process, limit_s=within_s)
        assert code in (1, 2) and time.monotonic() - noticed_from < within_s, output[-3000:]
        assert "frame #" not in output, output[-3000:]  # no C++ stack trace beside the line
        lines.append(one_error_line(output))
    return lines


def test_a_machine_whose_link_goes_down_mid_epoch_is_named_by_the_other(network, tmp_path):
    shard_0, shard_1 = start_both(
        network,
        tmp_path,
        *("--train_data", "null", "--epoch_size", "100000", "--print_every", "2"),
        *("--timeout", str(TIMEOUT_S), *through_a_directory(tmp_path, "ns4")),
    )
    read_until(shard_0, "Finished iteration 2/")  # past the first step: --timeout holds
    network.link_down("m1")
    down = time.monotonic()
    line_0, line_1 = lost_lines((shard_0, shard_1), down, TIMEOUT_S + NOTICE_S)
    assert "ranks 2, 3 (shard 1) of 4 were lost or stopped answering during" in line_0
    assert (
        f"the machine of rank 0 (shard 0), which serves the run's store at {network.address('m0')}:"
    ) in line_1
    assert "was lost or cut off from this one during" in line_1
    for line in (line_0, line_1):
        assert "the run cannot go on without every process" in line


def test_a_machine_whose_link_goes_down_during_the_meeting_is_named(network, tmp_path):
    first_iter_timeout_s = 20
    shard_0, shard_1 = start_both(
        network,
        tmp_path,
        *("--train_data", "null", "--epoch_size", "64"),
        *("--first_iter_timeout", str(first_iter_timeout_s)),
        *through_a_directory(tmp_path, "ns5"),
    )
    read_until(shard_0, "All 2 shards of run ns5 met")  # before their processes form the group
    network.link_down("m1")
    down = time.monotonic()
    line_0, line_1 = lost_lines((shard_0, shard_1), down, first_iter_timeout_s + NOTICE_S)
    # Either process of shard 0 may be the one to report (the first speaks for its machine); shard
    # 1's processes did not join, or (on a machine slow to read the line) stopped answering after.
    assert "could not form the process group: ranks 2, 3 (shard 1) of 4" in line_0
    assert f"store at {network.address('m0')}:" in line_1
