"""--grad_compression: what DDP's gradient all-reduce sends, through DDP's communication hooks.

- none: DDP's own all-reduce of float32 buckets.
- fp16, bf16: each bucket is cast to float16 (bfloat16), all-reduced and cast back
  (torch's fp16_compress_hook / bf16_compress_hook): half the bytes, no state.
- powersgd: each gradient matrix is sent as rank-r factors, with error feedback and warm start
  (torch's powerSGD_hook, Vogels et al. 2019), after --powersgd_start_iter plain iterations. Its
  state goes into checkpoints (powersgd_state.py, checkpoint/grad_compression_entry.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from resnet50_trainer.config.flags.distributed import GRAD_COMPRESSIONS
from resnet50_trainer.config.settings import Config
from resnet50_trainer.distributed.powersgd_state import ResumablePowerSGD
from resnet50_trainer.errors import UserError

log = logging.getLogger(__name__)
MODES = GRAD_COMPRESSIONS
NONE, FP16, BF16, POWERSGD = MODES
CASTING_HOOKS = {
    FP16: default_hooks.fp16_compress_hook,
    BF16: default_hooks.bf16_compress_hook,
}


@dataclass(frozen=True)
class CompressionSettings:
    mode: str  # --grad_compression
    rank: int  # --powersgd_rank
    start_iteration: int  # --powersgd_start_iter
    seed: int  # PowerSGD's fresh Q factors are drawn from it, the same on every process

    @classmethod
    def of(cls, config: Config) -> CompressionSettings:
        return cls(
            config.grad_compression, config.powersgd_rank, config.powersgd_start_iter, config.seed
        )


class GradCompression:
    """The run's compression, registered on its DDP; `powersgd` holds PowerSGD's state."""

    def __init__(self, settings: CompressionSettings, powersgd: ResumablePowerSGD | None = None):
        self.mode = settings.mode
        self.rank = settings.rank
        self.start_iteration = settings.start_iteration
        self.powersgd = powersgd

    def describe(self) -> str:
        if self.mode == POWERSGD:
            return (
                f"PowerSGD at rank {self.rank} from iteration {self.start_iteration} "
                "(error feedback, warm start)"
            )
        return {NONE: "none (float32)", FP16: "float16 buckets", BF16: "bfloat16 buckets"}[
            self.mode
        ]


def check_supported(config: Config) -> None:
    """torch's bf16 hook refuses to be registered, even on the CPU with Gloo, unless torch was
    built with CUDA (or ROCm) and an NCCL of 2.10 or later: say so before anything starts."""
    if config.grad_compression != BF16:
        return
    built_with_gpu = torch.version.cuda is not None or torch.version.hip is not None
    if not (built_with_gpu and dist.is_nccl_available() and torch.cuda.nccl.version() >= (2, 10)):
        raise UserError(
            f"--grad_compression bf16 needs a torch built with CUDA and NCCL 2.10 or later "
            f"(torch's bf16 hook checks for them even on the CPU), and this torch "
            f"{torch.__version__} is not: use --grad_compression fp16"
        )


def register(
    ddp: DistributedDataParallel, model: torch.nn.Module, settings: CompressionSettings
) -> GradCompression:
    """Register --grad_compression's hook on `ddp` (before its first step, as DDP requires)."""
    compression = _register_hook(ddp, model, settings)
    if compression.mode != NONE:
        log.info("Gradient all-reduce: %s", compression.describe())
    return compression


def _register_hook(
    ddp: DistributedDataParallel, model: torch.nn.Module, settings: CompressionSettings
) -> GradCompression:
    mode = settings.mode
    if mode in CASTING_HOOKS:
        ddp.register_comm_hook(None, CASTING_HOOKS[mode])
        return GradCompression(settings)
    if mode != POWERSGD:
        return GradCompression(settings)
    # torch's hook logs every bucket's allocation at INFO: our start line says what it does.
    logging.getLogger(powerSGD_hook.__name__).setLevel(logging.WARNING)
    powersgd = ResumablePowerSGD(
        model,
        settings.rank,
        settings.start_iteration,
        settings.seed,
        wait_each_bucket=dist.get_backend() == dist.Backend.GLOO,
    )
    ddp.register_comm_hook(powersgd, ResumablePowerSGD.hook)
    return GradCompression(settings, powersgd)
