"""The flags of a run's machines: shards, rendezvous, transport, timeouts and gradient
compression. Checked in checks.py. Part of the one parser (parser.py)."""

from __future__ import annotations

from resnet50_trainer.config.flags.declare import FlagGroup, flag, flag_group
from resnet50_trainer.config.values import (
    NO_TIME_LIMIT_S,
    REDIS_PORT,
    Number,
    path_value,
    redis_address,
)

# Upper bounds far beyond any real run, so an absurd value is refused here rather than crashing
# later (a C int overflowing in torch, a timeout that overflows a timedelta).
TIMEOUT_S = Number(float, 1, NO_TIME_LIMIT_S, infinity=NO_TIME_LIMIT_S)
MAX_SHARDS = 65536
# --grad_compression (grad_compression.py): DDP's float32 all-reduce, casting hooks, PowerSGD.
GRAD_COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
# PowerSGD's defaults: rank 2, as Vogels et al. 2019's main experiments; plain all-reduce for the
# first 1000 iterations, as torch's PowerSGDState (the first steps suffer most from inexact
# gradients).
DEFAULT_POWERSGD_RANK = 2
DEFAULT_POWERSGD_START_ITER = 1000
# PowerSGD's error feedback and warm start need 2 plain steps: DDP rebuilds its buckets after 1.
POWERSGD_START = Number(int, 2, 10**12)


@flag_group
class DistributedFlags(FlagGroup):
    TITLE = "distributed"

    num_shards: int = flag(type=Number(int, 1, MAX_SHARDS), if_absent=1)
    """machines in the run"""
    shard_id: int = flag(type=Number(int, 0, MAX_SHARDS - 1), if_absent=0)
    """this machine's index, from 0"""
    run_id: str | None = flag()
    """unique run id (e.g. a uuid); namespaces the rendezvous"""
    redis_host: str | None = flag(type=redis_address)
    """Redis server used for rendezvous, a host name or a redis://[:password@]host[:port][/db]
    URL"""
    redis_port: int = flag(type=REDIS_PORT, if_absent=6379)
    """Redis port"""
    redis_password: str | None = flag(default_from_env="REDIS_PASSWORD")
    """Redis password (default: $REDIS_PASSWORD); never printed or logged"""
    file_store_path: str = flag(type=path_value, if_absent="/tmp")
    """shared (NFS) directory for rendezvous when no Redis is given"""
    # None: NCCL's own choice
    distributed_transport: str | None = flag(choices=("tcp", "ibverbs"))
    """NCCL's transport between machines: tcp (sockets, InfiniBand off) or ibverbs (InfiniBand). A
    NCCL variable already set in the environment wins (default: NCCL's own choice)"""
    distributed_interfaces: str = flag(if_absent="")
    """network interface(s) for the distributed run, comma-separated (default: NCCL's and Gloo's own
    choice)"""
    first_iter_timeout: float = flag(type=TIMEOUT_S, if_absent=1200.0)
    """seconds allowed for the rendezvous, the first step (its batch from the input processes
    too) and each checkpoint barrier (the first process writing the checkpoint)"""
    timeout: float = flag(type=TIMEOUT_S, if_absent=60.0)
    """seconds a collective may wait on a peer after the first step, and a training process on a
    batch from its input processes"""


@flag_group
class GradCompressionFlags(FlagGroup):
    TITLE = "gradient compression"

    grad_compression: str = flag(if_absent="none", choices=GRAD_COMPRESSIONS)
    """what the gradient all-reduce sends: none (float32), fp16 or bf16 (each bucket cast, half the
    bytes), powersgd (low-rank factors with error feedback, PowerSGD)"""
    powersgd_rank: int = flag(type=Number(int, 1, 1024), if_absent=DEFAULT_POWERSGD_RANK)
    """with --grad_compression powersgd: rank of each gradient's approximation (higher: closer to
    the gradient, more bytes)"""
    powersgd_start_iter: int = flag(type=POWERSGD_START, if_absent=DEFAULT_POWERSGD_START_ITER)
    """with --grad_compression powersgd: global iterations of plain all-reduce before compression
    starts (the first steps are the most sensitive to inexact gradients)"""
