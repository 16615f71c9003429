"""One frozen dataclass of settings, and the values derived from it.

The command line builds a Config once (cli.py); nothing changes it afterwards. Defaults live in
cli.py's parser alone, so there is one default per setting.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlsplit, urlunsplit

from resnet50_trainer.errors import UserError

SYNTHETIC_DATA = "null"
# ResNet depths: torchvision's builders (model.py), named here so the command line needs no torch.
SUPPORTED_LAYERS = (18, 34, 50, 101, 152)
# The base learning rate is "based on 256 global batch size" (the original's docs).
LR_REFERENCE_BATCH = 256
# The original's step policy: x0.1 every 30 epochs of iterations.
LR_STEP_EPOCHS = 30
LR_STEP_FACTOR = 0.1
# An epoch of synthetic data, when --epoch_size is not given: the original's default.
SYNTHETIC_EPOCH_SIZE = 1_500_000
# The crop is this share of the resized shorter side by default: 224 of 256.
CROP_SHARE = 0.875


def resolve_scale(image_size: int, scale: Optional[int]) -> int:
    """--scale, or its default round(image_size / 0.875); the crop must fit in the resized image."""
    scale = scale or round(image_size / CROP_SHARE)
    if image_size > scale:
        raise UserError(f"--image_size {image_size} is above --scale {scale}: the crop must fit "
                        "in the resized image; raise --scale or lower --image_size")
    return scale


def effective_learning_rate(base_learning_rate: float, global_batch_size: int) -> float:
    """Linear scaling (Goyal et al. 2017), as the original's docs promised but its code did not do."""
    return base_learning_rate * global_batch_size / LR_REFERENCE_BATCH


@dataclass(frozen=True)
class Config:
    train_data: str
    test_data: Optional[str]
    db_type: str
    gpus: tuple[int, ...]  # the GPU ids this machine trains on; empty with use_cpu
    num_gpus: int  # processes per machine: GPUs, or CPU workers with use_cpu
    model_parallel: bool
    num_channels: int
    image_size: int
    scale: int
    num_labels: int
    num_layers: int
    batch_size: int  # total over this machine's devices, as the original
    epoch_size: Optional[int]
    num_epochs: int
    base_learning_rate: float
    warmup_epochs: float
    weight_decay: float
    cudnn_workspace_limit_mb: int
    num_shards: int
    shard_id: int
    run_id: Optional[str]
    redis_host: Optional[str]
    redis_port: int
    file_store_path: str
    save_model_name: str
    load_model_path: Optional[str]
    use_cpu: bool
    dtype: str
    float16_compute: bool
    enable_tensor_core: bool
    distributed_transport: str
    distributed_interfaces: str
    first_iter_timeout: float
    timeout: float
    log_dir: str
    checkpoint_dir: str
    num_workers: int
    seed: int
    max_bad_records: float
    print_every: int
    redis_password: Optional[str]
    keep_checkpoints: int
    checkpoint_every_iters: int
    compile: bool
    decode_device: str
    profile_iters: int
    pipeline_chunks: int

    @property
    def synthetic(self) -> bool:
        return self.train_data == SYNTHETIC_DATA

    @property
    def world_size(self) -> int:
        return self.num_shards * self.num_gpus

    @property
    def device_batch_size(self) -> int:
        return self.batch_size // self.num_gpus

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.num_shards

    @property
    def effective_learning_rate(self) -> float:
        return effective_learning_rate(self.base_learning_rate, self.global_batch_size)

    def iterations_per_epoch(self, num_records: int) -> int:
        """Steps per epoch: epoch_size over the global batch, or one pass over the DB without it."""
        images = self.epoch_size if self.epoch_size is not None else num_records
        return images // self.global_batch_size

    def to_dict(self) -> dict:
        """Plain types only, so a checkpoint can hold it and be loaded with weights_only=True."""
        values = dataclasses.asdict(self)
        values["gpus"] = list(self.gpus)
        # Never written to a log or a checkpoint, nor inside a redis:// URL.
        values["redis_password"] = None
        values["redis_host"] = _without_password(self.redis_host)
        return values


def _without_password(redis_host: Optional[str]) -> Optional[str]:
    if redis_host is None or "://" not in redis_host:
        return redis_host
    parts = urlsplit(redis_host)
    if parts.password is None:
        return redis_host
    host = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + host))
