"""This process's model replica and what trains it: the model (on one device, or split over a
pair with --model_parallel), its precision, DDP (with --grad_compression's communication hook,
compiled with --compile) and the optimizer.

A run of one process trains the model itself, not DDP around it: there is nothing to all-reduce,
DDP's bucketing costs 17% of a CPU step (benchmarks/train.py), and the arithmetic is the
same bit for bit. It keeps DDP where --grad_compression asks for a hook (which needs DDP): that
run's compression and PowerSGD state carry on as on more processes."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from resnet50_trainer.config.settings import Config
from resnet50_trainer.distributed.devices import replica_devices
from resnet50_trainer.distributed.grad_compression import (
    NONE,
    CompressionSettings,
    GradCompression,
    register,
)
from resnet50_trainer.distributed.process_group import Placement
from resnet50_trainer.model.ema import WeightsEma, build_ema
from resnet50_trainer.model.lr_schedule import LearningRateSchedule
from resnet50_trainer.model.optim import OptimizerSettings, build_optimizer
from resnet50_trainer.model.precision import Precision, PrecisionSettings
from resnet50_trainer.model.resnet import (
    Architecture,
    build_split_model,
    model_for,
    with_batch_norm_synced,
)


@dataclass
class Replica:
    model: torch.nn.Module  # unwrapped: its state dict has torchvision's names
    # DDP around `model`, or `model` itself in a run of one process (see above).
    train_module: torch.nn.Module
    train_model: Callable[..., torch.Tensor]  # what a training step calls: train_module, compiled
    optimizer: torch.optim.Optimizer
    precision: Precision
    # The logits (and so the labels they are scored against) are on the replica's last device.
    output_device: torch.device
    compression: GradCompression  # what the gradient all-reduce sends, and its state
    ema: WeightsEma | None = None  # --ema_decay: the average of the weights

    def checkpoint_entries(self) -> dict:
        """Its parts' checkpoint entries: weights (torchvision's names), optimizer, float16's
        scaler ({} without one), the weights' EMA (None without --ema_decay)."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.precision.scaler.state_dict(),
            "ema": self.ema.state() if self.ema else None,
        }

    def load_checkpoint_entries(self, state: dict) -> None:
        """Weights, optimizer and scaler from a checkpoint checked to fit (the EMA is restored
        apart: a checkpoint without one starts it, which needs saying)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler"):  # empty when the checkpoint's run had no float16 scaler
            self.precision.scaler.load_state_dict(state["scaler"])

    def no_sync(self) -> contextlib.AbstractContextManager:
        """Gradients kept local (the passes of an --iter_size step before its last)."""
        if isinstance(self.train_module, DistributedDataParallel):
            return self.train_module.no_sync()
        return contextlib.nullcontext()


@dataclass(frozen=True)
class Learner:
    """This process's part of the run, as the epoch loop and the checkpoint saver share it: where
    it sits (placement, device), what it trains (replica) and at what rate (schedule)."""

    placement: Placement
    device: torch.device
    replica: Replica
    schedule: LearningRateSchedule


def build_replica(
    config: Config,
    local_rank: int,
    device: torch.device,
    initial_weights: dict[str, torch.Tensor] | None = None,
) -> Replica:
    """`device`: this process's own (claim_device's), the first of a split replica's pair.
    `initial_weights` (checked to fit; a subset leaves the rest as initialised): loaded before DDP
    wraps the model, whose broadcast from rank 0 then gives every process rank 0's weights."""
    # A model-parallel replica's pair; the logits come out on its second device.
    devices = replica_devices(config, local_rank) if config.model_parallel else (device, device)
    precision = Precision(PrecisionSettings.of(config), device)
    model = _build_model(config, devices)
    if initial_weights is not None:
        model.load_state_dict(initial_weights, strict=False)
    model = with_batch_norm_synced(precision.prepare_model(model), config.sync_bn)
    train_module: torch.nn.Module = model
    compression_settings = CompressionSettings.of(config)
    compression = GradCompression(compression_settings)
    if dist.get_world_size() > 1 or compression_settings.mode != NONE:
        train_module = DistributedDataParallel(
            model,
            gradient_as_bucket_view=True,
            # A model-parallel replica spans two devices: DDP then takes no device_ids.
            device_ids=[device] if device.type == "cuda" and not config.model_parallel else None,
        )
        compression = register(
            train_module, model, compression_settings
        )  # before torch.compile traces DDP
    # Compiling the DDP module lets torch.compile split graphs at DDP's bucket boundaries.
    train_model = torch.compile(train_module) if config.compile else train_module
    optimizer = build_optimizer(model, OptimizerSettings.of(config))
    # After DDP's broadcast from rank 0: every process's average starts at the same weights.
    ema = build_ema(model, config.ema_decay, config.ema_steps)
    return Replica(
        model, train_module, train_model, optimizer, precision, devices[1], compression, ema
    )


def _build_model(config: Config, devices: tuple[torch.device, torch.device]) -> torch.nn.Module:
    architecture = Architecture.of(config)
    if not config.model_parallel:
        return model_for(architecture).to(devices[0])
    return build_split_model(
        architecture.num_layers,
        architecture.num_labels,
        architecture.num_channels,
        devices,
        config.pipeline_chunks,
        architecture.groups,
        architecture.width_per_group,
    )
