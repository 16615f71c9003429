"""One frozen dataclass of settings, the values derived from it, and the checks of settings
against each other.

The command line builds a Config once (cli.py), one field per flag; nothing changes it afterwards.
Names, types, defaults and help live in cli.py's parser alone, so each is written once.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from resnet50_trainer.errors import UserError

SYNTHETIC_DATA = "null"
# ResNet depths: torchvision's builders (model.py), named here so the command line needs no torch.
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
# The original's step policy: x0.1 every 30 epochs of iterations.
LR_STEP_EPOCHS = 30
LR_STEP_FACTOR = 0.1
# An epoch of synthetic data, when --epoch_size is not given: the original's default.
SYNTHETIC_EPOCH_SIZE = 1_500_000
# The crop is this share of the resized shorter side by default: 224 of 256.
CROP_SHARE = 0.875


def default_scale(image_size: int) -> int:
    """--scale's default: round(image_size / 0.875), 256 for 224."""
    return round(image_size / CROP_SHARE)


def resolve_scale(image_size: int, scale: int | None) -> int:
    """--scale, or its default; the crop must fit in the resized image."""
    scale = scale or default_scale(image_size)
    _check_crop_fits(image_size, scale)
    return scale


def _check_crop_fits(image_size: int, scale: int) -> None:
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
    weight_decay: float
    cudnn_workspace_limit_mb: int
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
    test_only: bool
    init_model: str | None

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
        for name in ("gpus", "image_mean_per_channel", "image_std_per_channel"):
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


def check_settings(config: Config) -> None:
    """The settings against each other, with no look at the machine; UserError on the first
    problem (the GPU choice and the run id are checked as they are worked out, in cli.py)."""
    if config.pipeline_chunks != 1 and not config.model_parallel:
        raise UserError(
            "--pipeline_chunks pipelines the two halves of a --model_parallel replica: "
            "add --model_parallel or leave it out"
        )
    if config.batch_size % config.processes_per_machine:
        raise UserError(
            f"--batch_size {config.batch_size} does not divide by the "
            f"{config.processes_per_machine} devices of this machine: use a multiple of "
            f"{config.processes_per_machine}"
        )
    if not 0 <= config.shard_id < config.num_shards:
        raise UserError(
            f"--shard_id {config.shard_id} is not below --num_shards "
            f"{config.num_shards}: shard ids run from 0 to {config.num_shards - 1}"
        )
    _check_crop_fits(config.image_size, config.scale)
    # Each flag is finite on its own; their product, the LR the run uses, must be too.
    if not math.isfinite(config.effective_learning_rate):
        raise UserError(
            f"--base_learning_rate {config.base_learning_rate:g} scaled to the global "
            f"batch of {config.global_batch_size} overflows to infinity: lower "
            "--base_learning_rate"
        )
    _check_precision_and_decoding(config)
    _check_later_flags(config)
    _check_evaluate_and_init(config)


def _check_later_flags(config: Config) -> None:
    """The later original's flags (imagenet_trainer.py) against the others."""
    for flag in ("image_mean_per_channel", "image_std_per_channel"):
        values = getattr(config, flag)
        if values is not None and len(values) != config.num_channels:
            raise UserError(
                f"--{flag} has {len(values)} values for --num_channels {config.num_channels}: "
                f"give one per channel ({config.num_channels})"
            )
    if config.resnext and config.num_layers in BASIC_BLOCK_LAYERS:
        raise UserError(
            f"--resnext_num_groups and --resnext_width_per_group change bottleneck blocks, "
            f"and ResNet-{config.num_layers} has none: use --num_layers 50, 101, 152 or 200, "
            "or leave them at 1 and 64"
        )


def _check_precision_and_decoding(config: Config) -> None:
    if config.float16_compute and config.dtype == "bfloat16":
        raise UserError(
            "--float16_compute asks for float16 arithmetic but --dtype bfloat16 for "
            "bfloat16: drop one of them"
        )
    if config.decode_device == "gpu" and config.synthetic:
        raise UserError(
            "--decode_device gpu has nothing to decode with --train_data null: leave it out"
        )
    if not config.use_cpu:
        return
    gpu_only = {
        "--dtype float16": (
            config.dtype == "float16",
            "float16 training needs a GPU (CPU float16 "
            "autocast is slow and unscaled): use --dtype bfloat16 on the CPU",
        ),
        "--float16_compute": (
            config.float16_compute,
            "float16 arithmetic needs a GPU: use --dtype bfloat16 on the CPU",
        ),
        "--enable_tensor_core": (
            config.enable_tensor_core,
            "tensor cores (TF32, channels_last) are GPU hardware: leave it out with --use_cpu",
        ),
        "--decode_device gpu": (
            config.decode_device == "gpu",
            "decoding on the GPU needs a GPU: leave it out with --use_cpu",
        ),
    }
    for flag, (given, reason) in gpu_only.items():
        if given:
            raise UserError(f"{flag} with --use_cpu: {reason}")


def _check_evaluate_and_init(config: Config) -> None:
    """--test_only evaluates a checkpoint on a test DB; --init_model starts a run, which a resume
    (--load_model_path) continues."""
    if config.test_only and not (config.load_model_path and config.test_data):
        missing = " and ".join(
            flag
            for flag, value in (
                ("--load_model_path", config.load_model_path),
                ("--test_data", config.test_data),
            )
            if not value
        )
        raise UserError(
            f"--test_only evaluates a checkpoint on a test DB: give {missing} "
            "(the checkpoint, or its directory, and the DB)"
        )
    if config.test_only and config.auto_resume:
        raise UserError(
            "--auto_resume continues a training run and --test_only trains nothing: "
            "leave --auto_resume out (a directory as --load_model_path scores its newest "
            "checkpoint)"
        )
    if config.init_model and config.load_model_path:
        raise UserError(
            "--init_model starts a new run from weights and --load_model_path continues an "
            "earlier one: give one of them"
        )
