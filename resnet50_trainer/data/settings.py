"""What the input pipeline needs of a run's settings, passed whole to the parts that build it."""

from __future__ import annotations

from dataclasses import dataclass

# --crop: scale, the original's (shorter side to --scale, a random square); random_resized,
# torchvision's RandomResizedCrop, with its defaults for --crop_area and --crop_ratio.
SCALE_CROP = "scale"
RANDOM_RESIZED_CROP = "random_resized"
CROPS = (SCALE_CROP, RANDOM_RESIZED_CROP)
DEFAULT_CROP_AREA = (0.08, 1.0)
DEFAULT_CROP_RATIO = (3 / 4, 4 / 3)


@dataclass(frozen=True)
class InputSettings:
    """How records become batches: what the trainer's flags say, or `resnet50-db bench` asks.
    The test images' settings hold the test sizes and the scale crop, which they are centred by."""

    num_labels: int
    num_channels: int
    scale: int  # shorter side before cropping (the scale crop, and every test image)
    image_size: int  # crop side
    seed: int  # of the crops
    num_workers: int  # input processes (0: the training process itself)
    decode_on_gpu: bool
    crop: str = SCALE_CROP  # a training crop of CROPS
    crop_area: tuple[float, float] = DEFAULT_CROP_AREA  # random_resized: share of the image's area
    crop_ratio: tuple[float, float] = DEFAULT_CROP_RATIO  # random_resized: width / height
