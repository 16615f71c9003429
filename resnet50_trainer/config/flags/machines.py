"""The flags of where a run trains: its devices (GPUs, CPU processes, precision and layout on
them) and its machines (shards, rendezvous, transport, timeouts). Part of the one parser
(parser.py)."""

from __future__ import annotations

import argparse
import os

from resnet50_trainer.config.settings import (
    DEFAULT_POWERSGD_RANK,
    DEFAULT_POWERSGD_START_ITER,
    GRAD_COMPRESSIONS,
)
from resnet50_trainer.config.values import (
    NO_TIME_LIMIT_S,
    REDIS_PORT,
    Number,
    Switch,
    gpu_list,
    redis_address,
)

# Upper bounds far beyond any real run, so an absurd value is refused here rather than crashing
# later (a C int overflowing in torch, a timeout that overflows a timedelta).
TIMEOUT_S = Number(float, 1, NO_TIME_LIMIT_S, infinity=NO_TIME_LIMIT_S)
MAX_SHARDS = 65536
# PowerSGD's error feedback and warm start need 2 plain steps: DDP rebuilds its buckets after 1.
POWERSGD_START = Number(int, 2, 10**12)


def add_device_flags(parser: argparse.ArgumentParser) -> None:
    devices = parser.add_argument_group("devices")
    devices.add_argument(
        "--gpus",
        type=gpu_list,
        help="comma-separated GPU ids, e.g. 0,1; or all (Caffe's --gpu all)",
    )
    devices.add_argument(
        "--num_gpus",
        dest="processes_per_machine",  # GPUs, or CPU workers: the field says what it is
        metavar="NUM_GPUS",
        type=Number(int, 1, 256),
        help="number of GPUs (instead of --gpus); with --use_cpu, the number of "
        "CPU training processes (default: 1)",
    )
    devices.add_argument("--use_cpu", action=Switch, help="train on CPU (Gloo)")
    devices.add_argument(
        "--model_parallel",
        action=Switch,
        help="split each model replica over 2 GPUs (so 2 x --num_gpus devices)",
    )
    devices.add_argument(
        "--dtype",
        default="float",
        choices=("float", "float16", "bfloat16"),
        help="training precision: float16 uses autocast and a gradient scaler "
        "(GPU only), bfloat16 autocast alone (GPU or CPU); weights stay float32",
    )
    devices.add_argument(
        "--float16_compute",
        action=Switch,
        help="fp16 arithmetic in conv and fc (GPU only): under autocast this is "
        "the same mode as --dtype float16",
    )
    devices.add_argument(
        "--enable_tensor_core",
        action=Switch,
        help="tensor-core maths for conv and fc (GPU only): TF32 in matmuls and "
        "convolutions, and channels_last tensors",
    )
    devices.add_argument(
        "--compile",
        action=Switch,
        help="compile the training model with torch.compile (the first steps "
        "take minutes; needs a C++ compiler on the CPU)",
    )
    devices.add_argument(
        "--pipeline_chunks",
        type=Number(int, 1, 1024),
        default=1,
        help="with --model_parallel: micro-batches per step, so both GPUs of a pair work at once",
    )
    devices.add_argument(
        "--cudnn_workspace_limit_mb",
        type=Number(int, 1, 1 << 20),
        help="cap on cuDNN's convolution workspace, in MiB (GPU only; the original capped it at "
        "64). PyTorch has no setting for it; this sets CUDNN_CONV_WSCAP_DBG, which cuDNN "
        "itself reads (listed in PyTorch's CUDA environment variables), unless that variable "
        "is already set (default: no cap)",
    )


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
