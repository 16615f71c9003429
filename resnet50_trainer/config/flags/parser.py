"""The trainer's flags, the original's and ours, each defined once: name, type and valid values,
default, help. Grouped as the help shows them: data, images and the input pipeline, devices,
model, optimisation and the learning rate (flags_optimisation.py), regularisation
(flags_regularisation.py), machines (devices and machines in flags_machines.py), logs and
checkpoints.
A flag's name is its Config field's (config.py), but where `dest` says otherwise."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from resnet50_trainer.config.flags.machines import add_device_flags, add_distributed_flags
from resnet50_trainer.config.flags.optimisation import (
    add_learning_rate_flags,
    add_optimisation_flags,
)
from resnet50_trainer.config.flags.regularisation import add_regularisation_flags
from resnet50_trainer.config.settings import RESNET_GROUPS, RESNET_WIDTH_PER_GROUP, SUPPORTED_LAYERS
from resnet50_trainer.config.values import (
    INPUT_WORKERS,
    NUM_LABELS,
    PIXELS,
    Bounds,
    FlagHelpFormatter,
    Number,
    NumberList,
    NumberValues,
    OneLineParser,
    Switch,
    add_version_flag,
)
from resnet50_trainer.data.settings import CROPS, DEFAULT_CROP_AREA, DEFAULT_CROP_RATIO, SCALE_CROP
from resnet50_trainer.errors import TRAINER

DEFAULT_IMAGE_SIZE = 227
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")  # it names Redis keys and files
COUNT_FROM_0 = Number(int, 0)
COUNT_FROM_1 = Number(int, 1)
PIXEL_MEAN = Number(float, 0, 255)
PIXEL_STD = Number(float, 0, 255, above_minimum=True)
RESNEXT_GROUPS = Number(int, 1, 1024)
RESNEXT_WIDTH = Number(int, 1, 4096)
CROP_AREA = Bounds(Number(float, 0, 1, above_minimum=True))
# Far beyond any real crop; a ratio nearer 0 or infinity would overflow the box's arithmetic.
CROP_RATIO = Bounds(Number(float, 0.001, 1000))


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=TRAINER,
        description="Train ResNet-50 (or 18/34/101/152/200, or a ResNeXt) with PyTorch "
        "DistributedDataParallel from an LMDB or LevelDB image database of Caffe Datum or "
        "Caffe2 TensorProtos records. "
        "Flags follow Caffe2's resnet50_trainer.py. A switch such as --use_cpu may also be "
        "given a value, as the original's were: true or false (or 1/0, yes/no, any case).",
        formatter_class=FlagHelpFormatter,
    )
    add_version_flag(parser)
    for add_flags in (
        _add_data_flags,
        _add_image_flags,
        add_device_flags,
        _add_model_flags,
        add_optimisation_flags,
        add_learning_rate_flags,
        add_regularisation_flags,
        add_distributed_flags,
        _add_output_flags,
    ):
        add_flags(parser)
    return parser


def given_flags(argv: Sequence[str] | None) -> set[str]:
    """The settings (argparse dests) the command line gives itself, which neither a --recipe nor
    a --solver file overrides."""
    parser = build_parser()
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv)))


def _add_data_flags(parser: argparse.ArgumentParser) -> None:
    data = parser.add_argument_group("data")
    data.add_argument(
        "--train_data",
        required=True,
        help="path of the training DB; the word 'null' trains on synthetic data",
    )
    data.add_argument("--test_data", help="path of the test DB, evaluated after every epoch")
    data.add_argument(
        "--db_type", default="lmdb", choices=("lmdb", "leveldb"), help="database type"
    )
    data.add_argument("--num_labels", type=NUM_LABELS, default=1000, help="number of classes")
    data.add_argument(
        "--test_epoch_size",
        type=Number(int, 1, 10**12),
        help="test images per evaluation: the first N of the test DB in key order "
        "(default: the whole test DB)",
    )
    data.add_argument(
        "--max_bad_records",
        type=Number(float, 0, 1, below_maximum=True),
        default=0.01,
        help="fraction of an epoch's records that may fail to decode (skipped and "
        "named) before the run stops",
    )


def _add_image_flags(parser: argparse.ArgumentParser) -> None:
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


def _add_model_flags(parser: argparse.ArgumentParser) -> None:
    model = parser.add_argument_group("model")
    model.add_argument(
        "--num_layers", type=Number(int), default=50, choices=SUPPORTED_LAYERS, help="ResNet depth"
    )
    model.add_argument(
        "--resnext_num_groups",
        type=RESNEXT_GROUPS,
        default=RESNET_GROUPS,
        help="groups of the bottlenecks' 3x3 convolutions: with --resnext_width_per_group, "
        "a ResNeXt (32 and 4 at 50 layers: ResNeXt-50 32x4d)",
    )
    model.add_argument(
        "--resnext_width_per_group",
        type=RESNEXT_WIDTH,
        default=RESNET_WIDTH_PER_GROUP,
        help="channels per group of the bottlenecks' 3x3 convolutions at the first stage",
    )


def _add_output_flags(parser: argparse.ArgumentParser) -> None:
    output = parser.add_argument_group("logs and checkpoints")
    output.add_argument("--log_dir", default=".", help="directory of the CSV run log")
    output.add_argument("--checkpoint_dir", help="directory of checkpoints (default: --log_dir)")
    output.add_argument("--save_model_name", default="resnet50_model", help="checkpoint name stem")
    output.add_argument("--load_model_path", help="checkpoint to continue training from")
    output.add_argument(
        "--auto_resume",
        action=Switch,
        help="continue from the newest usable checkpoint of this --checkpoint_dir and "
        "--save_model_name when there is one, else start as the other flags say (for "
        "torchrun --max-restarts, a Slurm requeue, a Kubernetes restart)",
    )
    output.add_argument(
        "--keep_checkpoints",
        type=COUNT_FROM_1,
        default=1,
        help="how many of the newest checkpoints to keep",
    )
    output.add_argument(
        "--checkpoint_every_iters",
        type=COUNT_FROM_0,
        default=0,
        help="also checkpoint every N iterations within an epoch (0: only at epoch ends)",
    )
    output.add_argument(
        "--profile_iters",
        type=COUNT_FROM_0,
        default=0,
        help="profile N steps after warm-up with torch.profiler; writes a Chrome "
        "trace next to the log",
    )
    output.add_argument(
        "--print_every",
        type=COUNT_FROM_1,
        default=100,
        help="print the original's iteration and loss lines every N iterations",
    )
    output.add_argument(
        "--log_top5",
        action=Switch,
        help="add a top5_test_accuracy column to the run log (the console shows top-5 "
        "anyway; without it the log keeps the original's columns)",
    )
    output.add_argument(
        "--tensorboard",
        action=Switch,
        help="also write TensorBoard event files (the log's columns per epoch; loss, accuracy, "
        "LR and input wait every --print_every steps) in --log_dir/tensorboard/<run>/, steps "
        "counted in global iterations, continued by a resume; view with tensorboard --logdir "
        "<log_dir>",
    )
    output.add_argument(
        "--test_only",
        action=Switch,
        help="evaluate the --load_model_path checkpoint on the whole --test_data DB, print "
        "its test accuracy, and stop: nothing is trained or written",
    )
    output.add_argument(
        "--init_model",
        metavar="PATH",
        help="start a fresh run from these weights (Caffe's --weights): one of our "
        "checkpoints or a torch.save(model.state_dict()) file; a classifier of another "
        "--num_labels is replaced by a fresh one",
    )
