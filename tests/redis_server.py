"""A real redis-server on 127.0.0.1 and a free port, for rendezvous tests (no mocks)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time

import pytest
import redis

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def running_redis(*extra_args: str):
    """Yields the port of a fresh, empty, non-persistent redis-server; stops it afterwards."""
    port = free_port()
    server = subprocess.Popen(
        [
            REDIS_SERVER,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
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
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    pytest.fail(f"redis-server did not start on port {port}")
                time.sleep(0.05)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
def redis_port():
    with running_redis() as port:
        yield port


def redis_keys(port: int) -> list[bytes]:
    return redis.Redis(port=port).keys("*")
