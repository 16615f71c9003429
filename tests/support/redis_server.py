"""A real redis-server on 127.0.0.1 (or another machine's address) and a free port, for rendezvous
tests (no mocks)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

import pytest
import redis

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def running_redis(*extra_args: str, bind: str = "127.0.0.1", prefix: Sequence[str] = ()):
    """Yields the port of a fresh, empty, non-persistent redis-server on `bind`; stops it
    afterwards. `prefix` starts it elsewhere: on another machine (`ip netns exec NS`), where
    `bind` is that machine's address."""
    port = free_port()
    server = subprocess.Popen(
        [
            *prefix,
            REDIS_SERVER,
            "--port",
            str(port),
            "--bind",
            bind,
            "--save",
            "",
            "--appendonly",
            "no",
            *extra_args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not _answers(bind, port, prefix):
            if time.monotonic() > deadline or server.poll() is not None:
                pytest.fail(f"redis-server did not start on port {port}")
            time.sleep(0.05)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=10)


def _answers(host: str, port: int, prefix: Sequence[str]) -> bool:
    """Whether a connection to host:port succeeds from where `prefix` runs commands."""
    if not prefix:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return True
        except OSError:
            return False
    connect = "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), 1)"
    probe = [*prefix, sys.executable, "-c", connect, host, str(port)]
    return subprocess.run(probe, capture_output=True).returncode == 0


@pytest.fixture
def redis_port():
    with running_redis() as port:
        yield port


def redis_keys(port: int) -> list[bytes | str]:
    return redis.Redis(port=port).keys("*")
