"""One frozen dataclass of settings and the values derived from it; flags/parser.py's
check_settings checks them against each other.

The command line builds a Config once (build.py), one field per flag; nothing changes it
afterwards. Names, types, defaults and help live in the parser (flags/) alone, so each is written
once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from resnet50_trainer.data.settings import window_mb_of
from resnet50_trainer.errors import UserError

SYNTHETIC_DATA = "null"
# ResNet depths: torchvision's builders (model/resnet.py), named here so the command line needs
# no torch.
SUPPORTED_LAYERS = (18, 34, 50, 101, 152, 200)
# Depths built of basic blocks, which torchvision makes only with 1 group of width 64.
BASIC_BLOCK_LAYERS = (18, 34)
# --resnext_num_groups and --resnext_width_per_group at these values: a plain ResNet.
RESNET_GROUPS = 1
RESNET_WIDTH_PER_GROUP = 64
# The base learning rate is "based on 256 global batch size" (the original's docs).
LR_REFERENCE_BATCH = 256
# --lr_scaling: linear follows those docs; none, the original's code (the base LR as given).
LINEAR_LR_SCALING = "linear"
LR_SCALINGS = (LINEAR_LR_SCALING, "none")
# --optimizer: the original's Nesterov momentum, or Caffe's plain momentum (type "SGD").
OPTIMIZERS = ("nesterov", "sgd")
# --grad_compression (grad_compression.py): DDP's float32 all-reduce, casting hooks, PowerSGD.
GRAD_COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
# PowerSGD's defaults: rank 2, as Vogels et al. 2019's main experiments; plain all-reduce for the
# first 1000 iterations, as torch's PowerSGDState (the first steps suffer most from inexact
# gradients).
DEFAULT_POWERSGD_RANK = 2
DEFAULT_POWERSGD_START_ITER = 1000
# An epoch of synthetic data, when --epoch_size is not given: the original's default.
SYNTHETIC_EPOCH_SIZE = 1_500_000
# The crop is this share of the resized shorter side by default: 224 of 256.
CROP_SHARE = 0.875
CROP_BOUNDS = ("crop_area", "crop_ratio")  # the flags of random_resized's bounds


def default_scale(image_size: int) -> int:
    """--scale's default: round(image_size / 0.875), 256 for 224."""
    return round(image_size / CROP_SHARE)


def resolve_scale(image_size: int, scale: int | None) -> int:
    """--scale, or its default; the crop must fit in the resized image."""
    scale = scale or default_scale(image_size)
    check_crop_fits(image_size, scale)
    return scale


def check_crop_fits(image_size: int, scale: int) -> None:
    if image_size > scale:
        raise UserError(
            f"--image_size {image_size} is above --scale {scale}: the crop must fit "
            "in the resized image; raise --scale or lower --image_size"
        )


def effective_learning_rate(
    base_learning_rate: float, global_batch_size: int, lr_scaling: str
) -> float:
    """Linear scaling (Goyal et al. 2017), as the original's docs promised but its code did not
    do; or, with --lr_scaling none, the base LR as given, as its code did."""
    if lr_scaling != LINEAR_LR_SCALING:
        return base_learning_rate
    return base_learning_rate * global_batch_size / LR_REFERENCE_BATCH


# Fields named for what they are whose flag keeps the original's name.
FLAG_OF_FIELD = {"processes_per_machine": "num_gpus"}


@dataclass(frozen=True)
class Config:
    train_data: str
    test_data: str | None
    db_type: str
    gpus: tuple[int, ...]  # the GPU ids this machine trains on; empty with use_cpu
    processes_per_machine: int  # the flag --num_gpus: GPUs, or CPU workers with use_cpu
    model_parallel: bool
    num_channels: int
    image_size: int
    scale: int
    num_labels: int
    num_layers: int
    batch_size: int  # total over this machine's devices, as the original
    epoch_size: int | None
    num_epochs: int
    base_learning_rate: float
    lr_scaling: str
    warmup_epochs: float
    lr_policy: str
    lr_steps: tuple[float, ...] | None  # epochs; None: the policy's default
    lr_gamma: float | None
    lr_power: float | None
    min_lr: float | None
    momentum: float
    optimizer: str
    iter_size: int  # passes each step's batch is split into, gradients accumulated
    weight_decay: float
    cudnn_workspace_limit_mb: int | None  # None: cuDNN's own workspace choice
    num_shards: int
    shard_id: int
    run_id: str | None
    redis_host: str | None
    redis_port: int
    file_store_path: str
    save_model_name: str
    load_model_path: str | None
    auto_resume: bool  # the newest checkpoint of checkpoint_dir, if any, wins over load_model_path
    use_cpu: bool
    dtype: str
    float16_compute: bool
    enable_tensor_core: bool
    distributed_transport: str | None  # None: NCCL's own choice
    distributed_interfaces: str
    first_iter_timeout: float
    timeout: float
    log_dir: str
    checkpoint_dir: str
    num_workers: int
    seed: int
    max_bad_records: float
    print_every: int
    redis_password: str | None
    keep_checkpoints: int
    checkpoint_every_iters: int
    compile: bool
    decode_device: str
    profile_iters: int
    pipeline_chunks: int
    test_epoch_size: int | None
    image_mean_per_channel: tuple[float, ...] | None  # the original's channel order: BGR
    image_std_per_channel: tuple[float, ...] | None
    resnext_num_groups: int
    resnext_width_per_group: int
    log_top5: bool
    tensorboard: bool
    test_only: bool
    init_model: str | None
    solver: str | None
    recipe: str
    crop: str
    crop_area: tuple[float, float] | None  # None: DEFAULT_CROP_AREA; set only with random_resized
    crop_ratio: tuple[float, float] | None  # None: DEFAULT_CROP_RATIO
    read_order: str  # as given: auto is resolved with the DB (train/inputs._agreed_read_order)
    read_window_mb: int | None  # None: DEFAULT_WINDOW_MB; refused with --read_order random
    test_resize: int | None  # None: scale
    test_image_size: int | None  # None: image_size
    label_smoothing: float
    mixup_alpha: float
    cutmix_alpha: float
    no_bn_weight_decay: bool
    ema_decay: float  # 0: no EMA of the weights
    ema_steps: int
    ema_for_test: bool
    sync_bn: bool
    grad_compression: str
    powersgd_rank: int
    powersgd_start_iter: int

    @property
    def synthetic(self) -> bool:
        return self.train_data == SYNTHETIC_DATA

    @property
    def resnext(self) -> bool:
        """Grouped or widened bottlenecks: a ResNeXt, not torchvision's plain ResNet."""
        return (self.resnext_num_groups, self.resnext_width_per_group) != (
            RESNET_GROUPS,
            RESNET_WIDTH_PER_GROUP,
        )

    @property
    def test_sizes(self) -> tuple[int, int]:
        """The test images' resized shorter side and centre crop: --test_resize and
        --test_image_size, by default the training's --scale and --image_size."""
        return self.test_resize or self.scale, self.test_image_size or self.image_size

    @property
    def window_mb(self) -> int:
        """--read_window_mb, or its default."""
        return window_mb_of(self.read_window_mb)

    @property
    def world_size(self) -> int:
        return self.num_shards * self.processes_per_machine

    @property
    def device_batch_size(self) -> int:
        return self.batch_size // self.processes_per_machine

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.num_shards

    @property
    def effective_learning_rate(self) -> float:
        return effective_learning_rate(
            self.base_learning_rate, self.global_batch_size, self.lr_scaling
        )

    @property
    def learning_rate_origin(self) -> str:
        """How the effective LR comes from --base_learning_rate, as the start line says it."""
        if self.lr_scaling != LINEAR_LR_SCALING:
            return f"base {self.base_learning_rate:g} as given: --lr_scaling {self.lr_scaling}"
        return f"base {self.base_learning_rate:g} x {self.global_batch_size} / {LR_REFERENCE_BATCH}"

    def iterations_per_epoch(self, num_records: int) -> int:
        """Steps per epoch: epoch_size over the global batch, or one pass over the DB without it."""
        images = self.epoch_size if self.epoch_size is not None else num_records
        return images // self.global_batch_size

    def to_dict(self) -> dict:
        """The settings by their flags' names (the original's Namespace, as the run log's first line
        and a checkpoint's arguments hold them); plain types only, so a checkpoint can hold them
        and be loaded with weights_only=True."""
        values = {
            FLAG_OF_FIELD.get(name, name): value for name, value in dataclasses.asdict(self).items()
        }
        for name in (
            "gpus",
            "image_mean_per_channel",
            "image_std_per_channel",
            "lr_steps",
            *CROP_BOUNDS,
        ):
            values[name] = None if values[name] is None else list(values[name])
        # Never written to a log or a checkpoint, nor inside a redis:// URL.
        values["redis_password"] = None
        values["redis_host"] = _without_password(self.redis_host)
        return values


def _without_password(redis_host: str | None) -> str | None:
    if redis_host is None or "://" not in redis_host:
        return redis_host
    parts = urlsplit(redis_host)
    if parts.password is None:
        return redis_host
    host = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}:***@" if parts.username else ":***@"
    return urlunsplit(parts._replace(netloc=user + host))
