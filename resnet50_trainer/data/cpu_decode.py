"""The CPU decode strategy: input processes decode and crop each record, the batch is copied to the
device. JPEGs are decoded by libjpeg-turbo, at 1/2 to 1/8 scale where the crop allows it; anything
else by Pillow."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

from resnet50_trainer.data import transforms
from resnet50_trainer.data.batch import Batch, Sample, filled_order, first_label_outside
from resnet50_trainer.data.formats.records import (
    Record,
    decode_image,
    decode_jpeg_reduced,
    jpeg_header,
)
from resnet50_trainer.data.settings import SCALE_CROP, InputSettings
from resnet50_trainer.errors import RecordError

log = logging.getLogger(__name__)


class CpuDecode:
    """Records -> uint8 crops in the input processes -> pinned Batches -> the device."""

    def __init__(self, settings: InputSettings):
        self.num_channels, self.image_size = settings.num_channels, settings.image_size
        # Pillow's draft mode reduces a JPEG towards a size given before the decode: the scale
        # crop's shorter side. A random-resized box needs the full size first: no draft.
        scaled = settings.crop == SCALE_CROP
        self.draft_size = (settings.scale, settings.scale) if scaled else None

    def sample(self, record: Record, key: bytes, plan_for: transforms.PlanFor) -> Sample:
        """The record decoded and cropped; RecordError if it cannot be decoded."""
        decoded = self._decode_jpeg(record, key, plan_for)
        if decoded is None:  # raw pixels, PNG, CMYK, or a JPEG libjpeg-turbo refused (draft mode)
            image = transforms.pil_to_chw(
                decode_image(record, self.num_channels, draft_size=self.draft_size)
            )
            # Planned for the image as decoded: a drafted one is cropped in its own pixels.
            decoded = image, plan_for(image.shape[2], image.shape[1], False).crop
        image, plan = decoded
        return Sample(transforms.resize_crop(image, plan, self.image_size), record.label, None)

    @staticmethod
    def failed(key: bytes, outside_label: int | None = None) -> Sample:
        return Sample(None, -1, key, outside_label)

    @staticmethod
    def collate(samples: Sequence[Sample]) -> Batch:
        """Stack a batch, its failed records' places filled with copies of good samples."""
        order = filled_order([sample.bad_key is not None for sample in samples])
        bad_keys = [sample.bad_key for sample in samples if sample.bad_key is not None]
        outside = first_label_outside(samples)
        if not order:
            return Batch(
                torch.empty(0, dtype=torch.uint8),
                torch.empty(0, dtype=torch.int64),
                bad_keys,
                outside,
            )
        images = [samples[i].image for i in order]  # `order` holds good samples only
        return Batch(
            torch.stack([image for image in images if image is not None]),
            torch.tensor([samples[i].label for i in order], dtype=torch.int64),
            bad_keys,
            outside,
        )

    @staticmethod
    def stage(device: torch.device) -> Callable[[Batch], Batch]:
        """A non-blocking copy to `device` (the loader pinned the memory)."""

        def copy(batch: Batch) -> Batch:
            return batch._replace(
                images=batch.images.to(device, non_blocking=True),
                labels=batch.labels.to(device, non_blocking=True),
            )

        return copy

    def _decode_jpeg(
        self, record: Record, key: bytes, plan_for: transforms.PlanFor
    ) -> tuple[torch.Tensor, transforms.CropPlan] | None:
        """CHW uint8 of a gray or colour JPEG, DCT-scaled down as far as its plan allows, and the
        crop in its pixels; None for anything else, and for a JPEG libjpeg-turbo refuses, which
        Pillow then gets to judge as before."""
        size = jpeg_header(record)
        if size is None or record.encoded is None:  # a JPEG header is only read from file bytes
            return None
        plan = plan_for(*size, True)
        try:
            pixels = decode_jpeg_reduced(record.encoded, size, self.num_channels, plan.reduction)
        except RecordError as error:
            log.debug("record %r: %s; trying Pillow", key, error)
            return None
        image = torch.from_numpy(pixels).permute(2, 0, 1)  # CHW view of HWC memory, as pil_to_chw
        return image, plan.crop
