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
LR_POLICIES = ("step", "multistep", "cosine", "poly", "exp", "inv", "fixed")
DEFAULT_LR_POLICY = "step"
# The original's step policy: x0.1 every 30 epochs of iterations.
DEFAULT_STEP_EPOCHS = 30.0
DEFAULT_GAMMA = 0.1
DEFAULT_POWER = 1.0
# The flags each policy reads; those it needs given, having no default that fits every run.
_READS = {
    "step": ("lr_steps", "lr_gamma"),
    "multistep": ("lr_steps", "lr_gamma"),
    "cosine": ("min_lr",),
    "poly": ("lr_power", "min_lr"),
    "exp": ("lr_gamma",),
    "inv": ("lr_gamma", "lr_power"),
    "fixed": (),
}
_NEEDS = {"multistep": ("lr_steps",), "exp": ("lr_gamma",), "inv": ("lr_gamma", "lr_power")}
# A gamma above 1 would raise the LR at every step without end.
_DECAYING_GAMMA = ("step", "multistep", "exp")
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
# --crop: scale, the original's (shorter side to --scale, a random square); random_resized,
# torchvision's RandomResizedCrop, with its defaults for --crop_area and --crop_ratio.
SCALE_CROP = "scale"
RANDOM_RESIZED_CROP = "random_resized"
CROPS = (SCALE_CROP, RANDOM_RESIZED_CROP)
DEFAULT_CROP_AREA = (0.08, 1.0)
DEFAULT_CROP_RATIO = (3 / 4, 4 / 3)
CROP_BOUNDS = ("crop_area", "crop_ratio")  # the flags of random_resized's bounds


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
    lr_policy: str
    lr_steps: tuple[float, ...] | None  # epochs; None: the policy's default
    lr_gamma: float | None
    lr_power: float | None
    min_lr: float | None
    momentum: float
    optimizer: str
    iter_size: int  # passes each step's batch is split into, gradients accumulated
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
    solver: str | None
    recipe: str
    crop: str
    crop_area: tuple[float, float] | None  # None: DEFAULT_CROP_AREA; set only with random_resized
    crop_ratio: tuple[float, float] | None  # None: DEFAULT_CROP_RATIO
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
    _check_crops(config)
    # Each flag is finite on its own; their product, the LR the run uses, must be too.
    if not math.isfinite(config.effective_learning_rate):
        raise UserError(
            f"--base_learning_rate {config.base_learning_rate:g} scaled to the global "
            f"batch of {config.global_batch_size} overflows to infinity: lower "
            "--base_learning_rate"
        )
    _check_lr_settings(config)
    _check_optimizer(config)
    _check_grad_compression(config)
    _check_precision_and_decoding(config)
    _check_later_flags(config)
    _check_evaluate_and_init(config)
    _check_ema_and_sync_bn(config)


def _check_lr_settings(config: Config) -> None:
    """Each LR flag read by the policy given, and the values that policy needs."""
    policy = config.lr_policy
    for flag in ("lr_steps", "lr_gamma", "lr_power", "min_lr"):
        if getattr(config, flag) is not None and flag not in _READS[policy]:
            readers = [name for name, flags in _READS.items() if flag in flags]
            raise UserError(
                f"--{flag} is not read by --lr_policy {policy}: only by "
                f"{', '.join(readers)}; leave it out or pick one of those"
            )
    for flag in _NEEDS.get(policy, ()):
        if getattr(config, flag) is None:
            raise UserError(f"--lr_policy {policy} needs --{flag}: give it")
    steps = config.lr_steps
    if policy == "step" and steps is not None and len(steps) != 1:
        raise UserError(
            f"--lr_policy step takes one --lr_steps value, the epochs between drops "
            f"(got {len(steps)}): for drops at given epochs use --lr_policy multistep"
        )
    if policy == "multistep" and steps is not None and list(steps) != sorted(set(steps)):
        raise UserError(
            "--lr_steps of --lr_policy multistep are the epochs of the drops, each after the "
            "one before: give them in increasing order, no repeats"
        )
    if policy in _DECAYING_GAMMA and (config.lr_gamma or 0) > 1:
        raise UserError(
            f"--lr_gamma {config.lr_gamma:g} is above 1: --lr_policy {policy} would raise the "
            "LR without end; give a gamma from 0 to 1"
        )
    if (config.min_lr or 0) > config.effective_learning_rate:
        raise UserError(
            f"--min_lr {config.min_lr:g} is above the run's LR "
            f"{config.effective_learning_rate:g}: the LR decays to --min_lr; lower it"
        )


def _check_optimizer(config: Config) -> None:
    if config.optimizer == "nesterov" and config.momentum == 0:
        raise UserError(
            "--optimizer nesterov needs momentum and --momentum is 0: give a --momentum "
            "above 0, or --optimizer sgd for plain SGD"
        )
    if config.device_batch_size % config.iter_size:
        raise UserError(
            f"--iter_size {config.iter_size} splits each process's batch of "
            f"{config.device_batch_size} into passes of equal size, and it does not divide: "
            f"use an --iter_size that divides {config.device_batch_size}"
        )


def _check_crops(config: Config) -> None:
    """--crop_area and --crop_ratio shape random-resized boxes only; the test crop must fit in the
    resized test image."""
    if config.crop != RANDOM_RESIZED_CROP:
        for flag in CROP_BOUNDS:
            if getattr(config, flag) is not None:
                raise UserError(
                    f"--{flag} bounds the boxes of --crop {RANDOM_RESIZED_CROP}, and this run has "
                    f"--crop {config.crop}: add --crop {RANDOM_RESIZED_CROP} or leave --{flag} out"
                )
    resize, size = config.test_sizes
    if size > resize:
        size_flag = "--test_image_size" if config.test_image_size else "--image_size"
        resize_flag = (
            f"--test_resize {resize}"
            if config.test_resize
            else f"--scale {resize} (the test images' resize without --test_resize)"
        )
        raise UserError(
            f"{size_flag} {size} is above {resize_flag}: the test crop must fit in the resized "
            "test image; give --test_resize at least that, or a smaller --test_image_size"
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
        "--sync_bn": (
            config.sync_bn,
            "PyTorch's SyncBatchNorm runs on GPUs only: leave it out with --use_cpu",
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


def _check_ema_and_sync_bn(config: Config) -> None:
    if config.ema_for_test and not (config.ema_decay or config.test_only):
        raise UserError(
            "--ema_for_test scores the EMA of the weights, which this run does not keep: "
            "add --ema_decay (e.g. 0.9999) or leave --ema_for_test out"
        )
    if config.sync_bn and config.model_parallel:
        raise UserError(
            "--sync_bn with --model_parallel: batch norm synchronised across replicas that "
            "each span two GPUs is not supported here; drop one of them"
        )
