"""One frozen dataclass of settings and the values derived from it; checks.py's check_settings
checks them against each other.

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
from resnet50_trainer.config.flags.images import ImageFlags
from resnet50_trainer.config.flags.model import RESNET_GROUPS, RESNET_WIDTH_PER_GROUP, ModelFlags
from resnet50_trainer.config.flags.optimisation import LearningRateFlags, OptimisationFlags
from resnet50_trainer.config.flags.outputs import OutputFlags
from resnet50_trainer.config.flags.regularisation import RegularisationFlags
from resnet50_trainer.config.lr_policies import effective_learning_rate, learning_rate_origin
from resnet50_trainer.data.settings import window_mb_of

# An epoch of synthetic data, when --epoch_size is not given: the original's default.
SYNTHETIC_EPOCH_SIZE = 1_500_000


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
        return learning_rate_origin(
            self.base_learning_rate, self.global_batch_size, self.lr_scaling
        )

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
        values = {
            flags[name]: list(value) if isinstance(value, tuple) else value
            for name, value in dataclasses.asdict(self).items()
        }
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
