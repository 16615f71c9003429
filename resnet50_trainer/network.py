"""Which network the run uses: --distributed_transport and --distributed_interfaces turned into
NCCL's and Gloo's settings, and the address this machine gives its peers."""

from __future__ import annotations

import logging
import os
import socket
from urllib.parse import urlsplit

import psutil

from resnet50_trainer.errors import UserError

log = logging.getLogger(__name__)
INFINIBAND_DEVICES = "/sys/class/infiniband"


def check_transport(transport: str, interfaces: str, use_cpu: bool) -> None:
    """Refuse a combination that NCCL or Gloo cannot honour, rather than ignore it."""
    names = [name for name in interfaces.split(",") if name]
    if transport == "ibverbs":
        if use_cpu:
            raise UserError(
                "--distributed_transport ibverbs needs GPUs (NCCL): PyTorch's Gloo "
                "has no InfiniBand transport; use --distributed_transport tcp "
                "with --use_cpu"
            )
        present = (
            sorted(os.listdir(INFINIBAND_DEVICES)) if os.path.isdir(INFINIBAND_DEVICES) else []
        )
        kind = "InfiniBand device"
    else:
        present = sorted(name for _, name in socket.if_nameindex())
        kind = "network interface"
    if transport == "ibverbs" and not present:
        raise UserError(
            "--distributed_transport ibverbs: this machine has no InfiniBand device "
            f"(nothing in {INFINIBAND_DEVICES}); use --distributed_transport tcp"
        )
    unknown = [name for name in names if name not in present]
    if unknown:
        raise UserError(
            f"--distributed_interfaces names {', '.join(unknown)}, not a {kind} of "
            f"this machine (it has: {', '.join(present) or 'none'})"
        )


def configure_transport(transport: str, interfaces: str) -> None:
    """Set NCCL's and Gloo's environment before any process group exists; spawned processes
    inherit it.

    tcp: NCCL over sockets (InfiniBand off), as the original's Gloo tcp; the interfaces are the
    socket interfaces of NCCL and Gloo. ibverbs: NCCL over InfiniBand; the interfaces are IB devices
    (e.g. mlx5_0), as the original's ibverbs named them. Gloo (CPU) is always TCP.
    """
    settings = {"NCCL_IB_DISABLE": "1" if transport == "tcp" else "0"}
    if interfaces and transport == "tcp":
        settings.update(NCCL_SOCKET_IFNAME=interfaces, GLOO_SOCKET_IFNAME=interfaces)
    elif interfaces:
        settings["NCCL_IB_HCA"] = interfaces
    for name, value in settings.items():
        if os.environ.get(name, value) != value:
            log.info(
                "%s=%s replaces %s from the environment (--distributed_transport/interfaces)",
                name,
                value,
                os.environ[name],
            )
        os.environ[name] = value


def advertised_host(interfaces: str, transport: str, redis_host: str | None) -> str:
    """The address peers reach this machine's store at: the first named interface's, else the one
    this machine routes to Redis through, else its host name's."""
    first = interfaces.split(",")[0]
    if first and transport == "tcp":
        addresses = psutil.net_if_addrs().get(first, [])
        ipv4 = [address.address for address in addresses if address.family == socket.AF_INET]
        if not ipv4:
            raise UserError(
                f"--distributed_interfaces {first} has no IPv4 address: name an "
                "interface the other machines can reach"
            )
        return ipv4[0]
    redis_name = urlsplit(redis_host).hostname if redis_host and "://" in redis_host else redis_host
    if redis_name:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((redis_name, 9))  # UDP connect sends nothing; it only picks a route
                return probe.getsockname()[0]
        except OSError:
            pass
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return socket.gethostname()
