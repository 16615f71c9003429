"""The image and input pipeline flags: channels, crop and resize sizes, the training crop and its
bounds, the test crop, pixel statistics, input processes and where JPEGs decode. Checked against
the others in checks.py. Part of the one parser (parser.py)."""

from __future__ import annotations

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
    SCALE_CROP,
)

DEFAULT_IMAGE_SIZE = 227


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
