"""The flags of a run's machines: shards, rendezvous, transport, timeouts and gradient
compression; and their checks. Part of the one parser (parser.py)."""

from __future__ import annotations

import argparse
import os

from resnet50_trainer.config.settings import (
    DEFAULT_POWERSGD_RANK,
    DEFAULT_POWERSGD_START_ITER,
    GRAD_COMPRESSIONS,
    Config,
)
from resnet50_trainer.config.values import (
    NO_TIME_LIMIT_S,
    REDIS_PORT,
    Number,
    redis_address,
)
from resnet50_trainer.errors import UserError

# Upper bounds far beyond any real run, so an absurd value is refused here rather than crashing
# later (a C int overflowing in torch, a timeout that overflows a timedelta).
TIMEOUT_S = Number(float, 1, NO_TIME_LIMIT_S, infinity=NO_TIME_LIMIT_S)
MAX_SHARDS = 65536
# PowerSGD's error feedback and warm start need 2 plain steps: DDP rebuilds its buckets after 1.
POWERSGD_START = Number(int, 2, 10**12)


def add_distributed_flags(parser: argparse.ArgumentParser) -> None:
    dist = parser.add_argument_group("distributed")
    dist.add_argument(
        "--num_shards", type=Number(int, 1, MAX_SHARDS), default=1, help="machines in the run"
    )
    dist.add_argument(
        "--shard_id",
        type=Number(int, 0, MAX_SHARDS - 1),
        default=0,
        help="this machine's index, from 0",
    )
    dist.add_argument("--run_id", help="unique run id (e.g. a uuid); namespaces the rendezvous")
    dist.add_argument(
        "--redis_host",
        type=redis_address,
        help="Redis server used for rendezvous, a host name or a "
        "redis://[:password@]host[:port][/db] URL",
    )
    dist.add_argument("--redis_port", type=REDIS_PORT, default=6379, help="Redis port")
    dist.add_argument(
        "--redis_password",
        default=os.environ.get("REDIS_PASSWORD"),
        help="Redis password (default: $REDIS_PASSWORD); never printed or logged",
    )
    dist.add_argument(
        "--file_store_path",
        default="/tmp",
        help="shared (NFS) directory for rendezvous when no Redis is given",
    )
    dist.add_argument(
        "--distributed_transport",
        choices=("tcp", "ibverbs"),
        help="NCCL's transport between machines: tcp (sockets, InfiniBand off) or ibverbs "
        "(InfiniBand). A NCCL variable already set in the environment wins (default: NCCL's "
        "own choice)",
    )
    dist.add_argument(
        "--distributed_interfaces",
        default="",
        help="network interface(s) for the distributed run, comma-separated "
        "(default: NCCL's and Gloo's own choice)",
    )
    dist.add_argument(
        "--first_iter_timeout",
        type=TIMEOUT_S,
        default=1200.0,
        help="seconds allowed for the rendezvous, the first step and each checkpoint barrier "
        "(the first process writing the checkpoint)",
    )
    dist.add_argument(
        "--timeout",
        type=TIMEOUT_S,
        default=60.0,
        help="seconds a collective may wait on a peer after the first step",
    )
    _add_compression_flags(parser)


def _add_compression_flags(parser: argparse.ArgumentParser) -> None:
    compression = parser.add_argument_group("gradient compression")
    compression.add_argument(
        "--grad_compression",
        default="none",
        choices=GRAD_COMPRESSIONS,
        help="what the gradient all-reduce sends: none (float32), fp16 or bf16 (each bucket "
        "cast, half the bytes), powersgd (low-rank factors with error feedback, PowerSGD)",
    )
    compression.add_argument(
        "--powersgd_rank",
        type=Number(int, 1, 1024),
        default=DEFAULT_POWERSGD_RANK,
        help="with --grad_compression powersgd: rank of each gradient's approximation "
        "(higher: closer to the gradient, more bytes)",
    )
    compression.add_argument(
        "--powersgd_start_iter",
        type=POWERSGD_START,
        default=DEFAULT_POWERSGD_START_ITER,
        help="with --grad_compression powersgd: global iterations of plain all-reduce before "
        "compression starts (the first steps are the most sensitive to inexact gradients)",
    )


def _check_grad_compression(config: Config) -> None:
    powersgd = config.grad_compression == "powersgd"
    for flag, default in (
        ("powersgd_rank", DEFAULT_POWERSGD_RANK),
        ("powersgd_start_iter", DEFAULT_POWERSGD_START_ITER),
    ):
        if getattr(config, flag) != default and not powersgd:
            raise UserError(
                f"--{flag} sets PowerSGD, and --grad_compression is {config.grad_compression}: "
                f"add --grad_compression powersgd or leave --{flag} out"
            )
    if powersgd and (config.dtype == "float16" or config.float16_compute):
        # A step the scaler skips has inf or NaN gradients, which error feedback would keep.
        raise UserError(
            "--grad_compression powersgd with float16 training: an overflowing step's inf "
            "gradients would stay in PowerSGD's error feedback for good; use --dtype bfloat16, "
            "or --grad_compression fp16"
        )


def check_distributed(config: Config) -> None:
    if not 0 <= config.shard_id < config.num_shards:
        raise UserError(
            f"--shard_id {config.shard_id} is not below --num_shards "
            f"{config.num_shards}: shard ids run from 0 to {config.num_shards - 1}"
        )
    _check_grad_compression(config)
