"""The image and input pipeline flags: channels, crop and resize sizes, the training crop and its
bounds, the test crop, pixel statistics, input processes and where JPEGs decode; and their checks
against each other. Part of the one parser (parser.py)."""

from __future__ import annotations

import argparse

from resnet50_trainer.config.settings import (
    CROP_BOUNDS,
    Config,
    check_crop_fits,
)
from resnet50_trainer.config.values import (
    INPUT_WORKERS,
    PIXELS,
    Bounds,
    Number,
    NumberList,
    NumberValues,
)
from resnet50_trainer.data.settings import (
    CROPS,
    DEFAULT_CROP_AREA,
    DEFAULT_CROP_RATIO,
    RANDOM_RESIZED_CROP,
    SCALE_CROP,
)
from resnet50_trainer.errors import UserError

DEFAULT_IMAGE_SIZE = 227


PIXEL_MEAN = Number(float, 0, 255)


PIXEL_STD = Number(float, 0, 255, above_minimum=True)


CROP_AREA = Bounds(Number(float, 0, 1, above_minimum=True))


# Far beyond any real crop; a ratio nearer 0 or infinity would overflow the box's arithmetic.
CROP_RATIO = Bounds(Number(float, 0.001, 1000))


def add_image_flags(parser: argparse.ArgumentParser) -> None:
    images = parser.add_argument_group("images and the input pipeline")
    images.add_argument(
        "--num_channels",
        type=Number(int),
        default=3,
        choices=(1, 3),
        help="colour channels; 1 trains on grayscale",
    )
    images.add_argument(
        "--image_size", type=PIXELS, default=DEFAULT_IMAGE_SIZE, help="crop size in pixels, square"
    )
    images.add_argument(
        "--scale",
        type=PIXELS,
        help="shorter side images are resized to before cropping "
        "(default: round(image_size / 0.875), 256 for 224; --scale 256 "
        "--image_size 227 is exactly the original)",
    )
    _add_crop_flags(images)
    for statistic, values in (("mean", PIXEL_MEAN), ("std", PIXEL_STD)):
        images.add_argument(
            f"--image_{statistic}_per_channel",
            action=NumberValues,
            type=NumberList(values),
            help=f"the pixels' {statistic} per channel in 0..255 units, one value per "
            "channel in the original's order (blue, green, red), separated by commas or "
            "spaces; inputs are (x - mean) / std (default: 128 each, the original's "
            "(x - 128) / 128)",
        )
    images.add_argument(
        "--num_workers",
        type=INPUT_WORKERS,
        help="input (decoding) processes per training process; 0 decodes in the "
        "training process (default: the cores per training process minus one, "
        "1 to 8)",
    )
    images.add_argument(
        "--decode_device",
        default="cpu",
        choices=("cpu", "gpu"),
        help="where JPEGs are decoded: cpu (input processes) or gpu (batched on the "
        "training GPU; input processes only read bytes)",
    )


def _add_crop_flags(images: argparse._ArgumentGroup) -> None:
    """The training crop and the test images' sizes (FixRes: test at a larger size than trained)."""
    images.add_argument(
        "--crop",
        default=SCALE_CROP,
        choices=CROPS,
        help="training crop: scale (shorter side to --scale, a random --image_size square, "
        "mirrored half the time: the original's) or random_resized (torchvision's "
        "RandomResizedCrop: a random box of --crop_area of the image and --crop_ratio "
        "width / height, resized to --image_size, mirrored half the time)",
    )
    for flag, bounds, default, what in (
        ("--crop_area", CROP_AREA, DEFAULT_CROP_AREA, "share of the image's area"),
        ("--crop_ratio", CROP_RATIO, DEFAULT_CROP_RATIO, "width / height (drawn log-uniform)"),
    ):
        images.add_argument(
            flag,
            type=bounds,
            metavar="MIN,MAX",
            help=f"--crop random_resized: the box's {what}, from MIN to MAX (default: "
            f"{default[0]:.4g},{default[1]:.4g}, torchvision's; valid: each "
            f"{bounds.number.describe()})",
        )
    images.add_argument(
        "--test_resize",
        type=PIXELS,
        help="shorter side the test images are resized to before their centre crop "
        "(default: --scale)",
    )
    images.add_argument(
        "--test_image_size",
        type=PIXELS,
        help="side of the test images' centre crop (default: --image_size); FixRes as "
        "torchvision's recipe: --image_size 176 --test_resize 232 --test_image_size 224",
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


def check_images(config: Config) -> None:
    check_crop_fits(config.image_size, config.scale)
    _check_crops(config)
    for flag in ("image_mean_per_channel", "image_std_per_channel"):
        values = getattr(config, flag)
        if values is not None and len(values) != config.num_channels:
            raise UserError(
                f"--{flag} has {len(values)} values for --num_channels {config.num_channels}: "
                f"give one per channel ({config.num_channels})"
            )
