"""The settings checked against each other once the command line is parsed: the flag groups
(config/flags/) only declare, and each rule here may read any of them and the values derived from
them (config/settings.py). check_settings runs them, with no look at the machine (that is
launch/probes.py's and launch/preflight.py's); the GPU choice and the run id are checked as
config/build.py works them out."""

from __future__ import annotations

import math

from resnet50_trainer.config.flags.distributed import (
    DEFAULT_POWERSGD_RANK,
    DEFAULT_POWERSGD_START_ITER,
)
from resnet50_trainer.config.flags.model import BASIC_BLOCK_LAYERS
from resnet50_trainer.config.flags.optimisation import NESTEROV
from resnet50_trainer.config.lr_policies import BY_NAME, DEFAULT_MIN_LR, POLICY_FLAGS, readers
from resnet50_trainer.config.settings import Config
from resnet50_trainer.config.shared_checks import check_crop_fits, check_read_window
from resnet50_trainer.config.values import RESNET_STRIDE
from resnet50_trainer.data.settings import CROP_BOUNDS, RANDOM_RESIZED_CROP
from resnet50_trainer.errors import UserError


def check_settings(config: Config) -> None:
    """The settings against each other, area by area; UserError on the first problem."""
    for check in (
        check_data,
        check_devices,
        check_optimisation,
        check_distributed,
        check_images,
        check_model,
        check_outputs,
        check_regularisation,
    ):
        check(config)


def check_data(config: Config) -> None:
    check_read_window(config.read_order, config.read_window_mb)


def _check_crops(config: Config) -> None:
    """--crop_area and --crop_ratio shape random-resized boxes only; the test crop must fit in the
    resized test image."""
    if config.crop != RANDOM_RESIZED_CROP:
        for name in CROP_BOUNDS:
            if getattr(config, name) is not None:
                raise UserError(
                    f"--{name} bounds the boxes of --crop {RANDOM_RESIZED_CROP}, and this run has "
                    f"--crop {config.crop}: add --crop {RANDOM_RESIZED_CROP} or leave --{name} out"
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


def check_images(config: Config) -> None:
    check_crop_fits(config.image_size, config.scale)
    _check_crops(config)
    for name in ("image_mean_per_channel", "image_std_per_channel"):
        values = getattr(config, name)
        if values is not None and len(values) != config.num_channels:
            raise UserError(
                f"--{name} has {len(values)} values for --num_channels {config.num_channels}: "
                f"give one per channel ({config.num_channels})"
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
    for setting, (given, reason) in gpu_only.items():
        if given:
            raise UserError(f"{setting} with --use_cpu: {reason}")


def check_devices(config: Config) -> None:
    if config.gpus_shared and config.model_parallel:
        raise UserError(
            "--model_parallel splits each replica over 2 GPUs of its own, but --gpus lists a GPU "
            "more than once: list each GPU once"
        )
    if config.pipeline_chunks != 1 and not config.model_parallel:
        raise UserError(
            "--pipeline_chunks pipelines the two halves of a --model_parallel replica: "
            "add --model_parallel or leave it out"
        )
    _check_precision_and_decoding(config)


def check_model(config: Config) -> None:
    if config.resnext and config.num_layers in BASIC_BLOCK_LAYERS:
        raise UserError(
            f"--resnext_num_groups and --resnext_width_per_group change bottleneck blocks, "
            f"and ResNet-{config.num_layers} has none: use --num_layers 50, 101, 152 or 200, "
            "or leave them at 1 and 64"
        )


def _check_lr_settings(config: Config) -> None:
    """Each LR name read by the policy given, and the values that policy needs."""
    policy = BY_NAME[config.lr_policy]
    for name in POLICY_FLAGS:
        if getattr(config, name) is not None and name not in policy.reads:
            raise UserError(
                f"--{name} is not read by --lr_policy {policy.name}: only by "
                f"{', '.join(readers(name))}; leave it out or pick one of those"
            )
    for name in policy.needs:
        if getattr(config, name) is None:
            raise UserError(f"--lr_policy {policy.name} needs --{name}: give it")
    if policy.check_steps is not None and config.lr_steps is not None:
        policy.check_steps(policy.name, config.lr_steps)
    if policy.gamma_at_most_one and (config.lr_gamma or 0) > 1:
        raise UserError(
            f"--lr_gamma {config.lr_gamma:g} is above 1: --lr_policy {policy.name} would raise "
            "the LR without end; give a gamma from 0 to 1"
        )
    # One rule for every policy: the warm-up ends before the run does. Cosine and poly would have
    # nothing left to decay over; the others would never run at the LR asked for.
    if config.warmup_epochs >= config.num_epochs:
        raise UserError(
            f"--warmup_epochs {config.warmup_epochs:g} leaves nothing of the {config.num_epochs} "
            f"epochs after the warm-up, where --lr_policy {policy.name} runs from the full LR: "
            f"shorten the warm-up to below {config.num_epochs} epochs or run longer"
        )
    min_lr = DEFAULT_MIN_LR if config.min_lr is None else config.min_lr
    if min_lr > config.effective_learning_rate:
        raise UserError(
            f"--min_lr {min_lr:g} is above the run's LR "
            f"{config.effective_learning_rate:g}: the LR decays to --min_lr; lower it"
        )


def _check_training_batches(config: Config) -> None:
    """An epoch holds a global batch at least; a pass gives BatchNorm 2 values a channel at
    least (in training it normalises over a pass's images and the last stage's positions, and
    torch refuses one value)."""
    if config.epoch_size is not None and config.epoch_size < config.global_batch_size:
        machines = f" x --num_shards {config.num_shards}" if config.num_shards > 1 else ""
        raise UserError(
            f"--epoch_size {config.epoch_size} is less than one global batch of "
            f"{config.global_batch_size} (--batch_size {config.batch_size}{machines}): raise "
            f"--epoch_size to {config.global_batch_size} or more, or lower --batch_size"
        )
    images = config.device_batch_size // config.iter_size
    side = -(-config.image_size // RESNET_STRIDE)
    if images * side * side < 2:
        raise UserError(
            f"a training pass holds 1 image (--batch_size {config.batch_size} / "
            f"{config.processes_per_machine} processes / --iter_size {config.iter_size}) and "
            f"at --image_size {config.image_size} ResNet's last stage is 1x1, so BatchNorm "
            "would normalise one value a channel, which it cannot: give a pass 2 images or more "
            "(a larger --batch_size, a smaller --iter_size) or raise --image_size above "
            f"{RESNET_STRIDE}"
        )


def _check_optimizer(config: Config) -> None:
    if config.optimizer == NESTEROV and config.momentum == 0:
        raise UserError(
            "--optimizer nesterov needs momentum and --momentum is 0: give a --momentum "
            "above 0, or --optimizer sgd for plain SGD"
        )


def check_optimisation(config: Config) -> None:
    if config.batch_size % config.processes_per_machine:
        raise UserError(
            f"--batch_size {config.batch_size} does not divide by the "
            f"{config.processes_per_machine} devices of this machine: use a multiple of "
            f"{config.processes_per_machine}"
        )
    if config.device_batch_size % config.iter_size:
        raise UserError(
            f"--iter_size {config.iter_size} splits each process's batch of "
            f"{config.device_batch_size} into passes of equal size, and it does not divide: "
            f"use an --iter_size that divides {config.device_batch_size}"
        )
    if not config.test_only:
        _check_training_batches(config)
    # Each flag is finite on its own; their product, the LR the run uses, must be too.
    if not math.isfinite(config.effective_learning_rate):
        raise UserError(
            f"--base_learning_rate {config.base_learning_rate:g} scaled to the global "
            f"batch of {config.global_batch_size} overflows to infinity: lower "
            "--base_learning_rate"
        )
    _check_lr_settings(config)
    _check_optimizer(config)


def check_regularisation(config: Config) -> None:
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


def _check_grad_compression(config: Config) -> None:
    powersgd = config.grad_compression == "powersgd"
    for name, default in (
        ("powersgd_rank", DEFAULT_POWERSGD_RANK),
        ("powersgd_start_iter", DEFAULT_POWERSGD_START_ITER),
    ):
        if getattr(config, name) != default and not powersgd:
            raise UserError(
                f"--{name} sets PowerSGD, and --grad_compression is {config.grad_compression}: "
                f"add --grad_compression powersgd or leave --{name} out"
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


def check_outputs(config: Config) -> None:
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
    if config.test_only and config.profile_iters:
        raise UserError(
            "--profile_iters profiles training steps and --test_only trains none: leave "
            "--profile_iters out"
        )
    if config.init_model and config.load_model_path:
        raise UserError(
            "--init_model starts a new run from weights and --load_model_path continues an "
            "earlier one: give one of them"
        )
