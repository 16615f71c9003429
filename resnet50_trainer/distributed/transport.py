"""Which network the run uses: --distributed_transport and --distributed_interfaces turned into
NCCL's and Gloo's settings, and the address this machine gives its peers."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping
from urllib.parse import urlsplit

import psutil

from resnet50_trainer.errors import UserError

log = logging.getLogger(__name__)
INFINIBAND_DEVICES = "/sys/class/infiniband"


def check_transport(transport: str | None, interfaces: str, use_cpu: bool) -> None:
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


def transport_environment(
    transport: str | None, interfaces: str, environ: Mapping[str, str]
) -> dict[str, str]:
    """The NCCL and Gloo variables the flags ask for that `environ` does not set already: a
    variable the user set wins (logged where it differs). Without --distributed_transport, NCCL
    picks its transport itself (InfiniBand where it finds it).

    tcp: NCCL over sockets (InfiniBand off), as the original's Gloo tcp; the interfaces are the
    socket interfaces of NCCL and Gloo (so too without a transport). ibverbs: NCCL over InfiniBand;
    the interfaces are IB devices (e.g. mlx5_0), as the original's ibverbs named them. Gloo (CPU)
    is always TCP."""
    settings = {} if transport is None else {"NCCL_IB_DISABLE": str(int(transport == "tcp"))}
    if interfaces and transport == "ibverbs":
        settings["NCCL_IB_HCA"] = interfaces
    elif interfaces:
        settings.update(NCCL_SOCKET_IFNAME=interfaces, GLOO_SOCKET_IFNAME=interfaces)
    for name, value in settings.items():
        if environ.get(name, value) != value:
            log.warning(
                "%s=%s from the environment wins over the %s that "
                "--distributed_transport/--distributed_interfaces ask for",
                name,
                environ[name],
                value,
            )
    return {name: value for name, value in settings.items() if name not in environ}


def configure_transport(transport: str | None, interfaces: str) -> None:
    """Set NCCL's and Gloo's environment before any process group exists; spawned processes
    inherit it."""
    os.environ.update(transport_environment(transport, interfaces, os.environ))


def advertised_host(interfaces: str, transport: str | None, redis_host: str | None) -> str:
    """The address peers reach this machine's store at: the first named interface's, else the one
    this machine routes to Redis through, else its host name's."""
    first = interfaces.split(",")[0]
    if first and transport != "ibverbs":
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
