"""The image and input pipeline flags: channels, crop and resize sizes, the training crop and its
bounds, the test crop, pixel statistics, input processes and where JPEGs decode; and their checks
against each other. Part of the one parser (parser.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from resnet50_trainer.config.flags.declare import FlagGroup, flag, flag_group
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

if TYPE_CHECKING:
    from resnet50_trainer.config.settings import Config

DEFAULT_IMAGE_SIZE = 227
# The crop is this share of the resized shorter side by default: 224 of 256.
CROP_SHARE = 0.875
CROP_BOUNDS = ("crop_area", "crop_ratio")  # the flags of random_resized's bounds


PIXEL_MEAN = Number(float, 0, 255)


PIXEL_STD = Number(float, 0, 255, above_minimum=True)


CROP_AREA = Bounds(Number(float, 0, 1, above_minimum=True))


# Far beyond any real crop; a ratio nearer 0 or infinity would overflow the box's arithmetic.
CROP_RATIO = Bounds(Number(float, 0.001, 1000))


def _per_channel_help(statistic: str) -> str:
    """--image_mean_per_channel's or --image_std_per_channel's help."""
    return (
        f"the pixels' {statistic} per channel in 0..255 units, one value per channel in the "
        "original's order (blue, green, red), separated by commas or spaces; inputs are "
        "(x - mean) / std (default: 128 each, the original's (x - 128) / 128)"
    )


def _crop_bound_help(bounds: Bounds, default: tuple[float, float], what: str) -> str:
    """--crop_area's or --crop_ratio's help: a random-resized box's bounds."""
    return (
        f"--crop random_resized: the box's {what}, from MIN to MAX (default: "
        f"{default[0]:.4g},{default[1]:.4g}, torchvision's; valid: each "
        f"{bounds.number.describe()})"
    )


@flag_group
class ImageFlags(FlagGroup):
    """Images and the input pipeline; the training crop and the test images' sizes (FixRes: test
    at a larger size than trained)."""

    TITLE = "images and the input pipeline"

    num_channels: int = flag(type=Number(int), if_absent=3, choices=(1, 3))
    """colour channels; 1 trains on grayscale"""
    image_size: int = flag(type=PIXELS, if_absent=DEFAULT_IMAGE_SIZE)
    """crop size in pixels, square"""
    # its default worked out by config/build.py
    scale: int = flag(type=PIXELS)
    """shorter side images are resized to before cropping (default: round(image_size / 0.875), 256
    for 224; --scale 256 --image_size 227 is exactly the original)"""
    crop: str = flag(if_absent=SCALE_CROP, choices=CROPS)
    """training crop: scale (shorter side to --scale, a random --image_size square, mirrored half
    the time: the original's) or random_resized (torchvision's RandomResizedCrop: a random box of
    --crop_area of the image and --crop_ratio width / height, resized to --image_size, mirrored half
    the time)"""
    # None: DEFAULT_CROP_AREA and DEFAULT_CROP_RATIO; set only with random_resized.
    crop_area: tuple[float, float] | None = flag(
        type=CROP_AREA,
        metavar="MIN,MAX",
        help=_crop_bound_help(CROP_AREA, DEFAULT_CROP_AREA, "share of the image's area"),
    )
    crop_ratio: tuple[float, float] | None = flag(
        type=CROP_RATIO,
        metavar="MIN,MAX",
        help=_crop_bound_help(CROP_RATIO, DEFAULT_CROP_RATIO, "width / height (drawn log-uniform)"),
    )
    # None: scale
    test_resize: int | None = flag(type=PIXELS)
    """shorter side the test images are resized to before their centre crop (default: --scale)"""
    # None: image_size
    test_image_size: int | None = flag(type=PIXELS)
    """side of the test images' centre crop (default: --image_size); FixRes as torchvision's recipe:
    --image_size 176 --test_resize 232 --test_image_size 224"""
    # The original's channel order: BGR.
    image_mean_per_channel: tuple[float, ...] | None = flag(
        action=NumberValues, type=NumberList(PIXEL_MEAN), help=_per_channel_help("mean")
    )
    image_std_per_channel: tuple[float, ...] | None = flag(
        action=NumberValues, type=NumberList(PIXEL_STD), help=_per_channel_help("std")
    )
    # its default worked out by config/build.py
    num_workers: int = flag(type=INPUT_WORKERS)
    """input (decoding) processes per training process; 0 decodes in the training process (default:
    the cores per training process minus one, 1 to 8; the cores are those the run may use, its CPU
    affinity, as a Slurm task's or taskset's)"""
    decode_device: str = flag(if_absent="cpu", choices=("cpu", "gpu"))
    """where JPEGs are decoded: cpu (input processes) or gpu (batched on the training GPU; input
    processes only read bytes)"""


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
