"""One frozen dataclass of settings and the values derived from it; flags/parser.py's
check_settings checks them against each other.

The command line builds a Config once (build.py), one field per flag; nothing changes it
afterwards. Each field is declared once, as its flag, in its group's dataclass (flags/data.py,
flags/images.py, ...: name, type, default, valid values, help), and Config inherits them all.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from resnet50_trainer.config.flags.data import SYNTHETIC_DATA, DataFlags
from resnet50_trainer.config.flags.declare import flag_names
from resnet50_trainer.config.flags.devices import DeviceFlags
from resnet50_trainer.config.flags.distributed import DistributedFlags, GradCompressionFlags
from resnet50_trainer.config.flags.images import CROP_BOUNDS, ImageFlags
from resnet50_trainer.config.flags.model import RESNET_GROUPS, RESNET_WIDTH_PER_GROUP, ModelFlags
from resnet50_trainer.config.flags.optimisation import (
    LINEAR_LR_SCALING,
    LearningRateFlags,
    OptimisationFlags,
)
from resnet50_trainer.config.flags.outputs import OutputFlags
from resnet50_trainer.config.flags.regularisation import RegularisationFlags
from resnet50_trainer.data.settings import window_mb_of

# The base learning rate is "based on 256 global batch size" (the original's docs).
LR_REFERENCE_BATCH = 256
# An epoch of synthetic data, when --epoch_size is not given: the original's default.
SYNTHETIC_EPOCH_SIZE = 1_500_000


def effective_learning_rate(
    base_learning_rate: float, global_batch_size: int, lr_scaling: str
) -> float:
    """Linear scaling (Goyal et al. 2017), as the original's docs promised but its code did not
    do; or, with --lr_scaling none, the base LR as given, as its code did."""
    if lr_scaling != LINEAR_LR_SCALING:
        return base_learning_rate
    return base_learning_rate * global_batch_size / LR_REFERENCE_BATCH


# The flag groups last to first: a dataclass's fields start with its last base's, so Config's
# fields (and the saved settings, to_dict) follow --help's order, which flags/parser.py reads
# from here.
@dataclass(frozen=True)
class Config(
    OutputFlags,
    GradCompressionFlags,
    DistributedFlags,
    RegularisationFlags,
    LearningRateFlags,
    OptimisationFlags,
    ModelFlags,
    DeviceFlags,
    ImageFlags,
    DataFlags,
):
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

    @property
    def gpus_shared(self) -> bool:
        """Whether --gpus lists a GPU more than once: its processes share it, and all-reduce over
        Gloo (NCCL needs a GPU a process)."""
        return len(set(self.gpus)) < len(self.gpus)

    def iterations_per_epoch(self, num_records: int) -> int:
        """Steps per epoch: epoch_size over the global batch, or one pass over the DB without it."""
        images = self.epoch_size if self.epoch_size is not None else num_records
        return images // self.global_batch_size

    def to_dict(self) -> dict:
        """The settings by their flags' names (the original's Namespace, as the run log's first line
        and a checkpoint's arguments hold them); plain types only, so a checkpoint can hold them
        and be loaded with weights_only=True."""
        flags = flag_names(Config)
        values = {flags[name]: value for name, value in dataclasses.asdict(self).items()}
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
