"""The CPU decode strategy: input processes decode and crop each record, the batch is copied to the
device. JPEGs are decoded by libjpeg-turbo, only the crop's box (formats/jpeg_region.py) and at
1/2 to 1/8 scale where the crop allows it; anything else by Pillow.

A batch is made whole in the input process (`batch`, the DataLoader's batched fetch): each crop is
resized straight into its place in one uint8 batch tensor, allocated in shared memory inside an
input process (the memory the training process then maps: no copy on the way). The batch is NCHW
in channels-last memory, the layout the resize makes: a planar slot would cost a strided copy
about a third as long as the resize (model/precision.py lays the batch out for the model on the
device). `sample` and `collate` do the same one record at a time, for the GPU strategy's fallback
and for callers that index the records one by one."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import get_worker_info

from resnet50_trainer.data import transforms
from resnet50_trainer.data.batch import Batch, Fetched, Sample, filled_order, first_label_outside
from resnet50_trainer.data.formats.images import decode_image, jpeg_header
from resnet50_trainer.data.formats.jpeg_region import decode_jpeg_box
from resnet50_trainer.data.formats.records import Record
from resnet50_trainer.data.settings import SCALE_CROP, InputSettings
from resnet50_trainer.data.spans import COPY_TO_DEVICE
from resnet50_trainer.errors import RecordError

log = logging.getLogger(__name__)


class CpuDecode:
    """Records -> uint8 crops in the input processes -> pinned Batches -> the device."""

    STAGE_SPAN = COPY_TO_DEVICE

    def __init__(self, settings: InputSettings):
        self.num_channels, self.image_size = settings.num_channels, settings.image_size
        # Pillow's draft mode reduces a JPEG towards a size given before the decode: the scale
        # crop's shorter side. A random-resized box needs the full size first: no draft.
        scaled = settings.crop == SCALE_CROP
        self.draft_size = (settings.scale, settings.scale) if scaled else None

    def sample(self, record: Record, key: bytes, plan_for: transforms.PlanFor) -> Sample:
        """The record decoded and cropped; RecordError if it cannot be decoded."""
        pixels, plan = self._decode(record, key, plan_for)
        crop = transforms.resize_crop(transforms.chw(pixels), plan, self.image_size)
        return Sample(crop, record.label, None)

    def batch(self, fetched: Sequence[Fetched]) -> Batch:
        """The records of a batch (None for one that could not be read), decoded into one batch
        tensor, with the failed records' places filled as `collate` fills them."""
        with _one_thread():
            return self._batch(fetched)

    def _batch(self, fetched: Sequence[Fetched]) -> Batch:
        size, channels = self.image_size, self.num_channels
        slots = _batch_tensor((len(fetched), size, size, channels))
        slot_pixels = slots.numpy()
        labels, failed, bad_keys = [], [], []
        for slot, (record, key, plan_for) in enumerate(fetched):
            try:
                if record is None:
                    raise RecordError("unreadable")  # already logged by the reader
                pixels, plan = self._decode(record, key, plan_for)
            except RecordError as error:
                log.debug("record %r: %s", key, error)
                failed.append(True)
                labels.append(-1)
                bad_keys.append(key)
                continue
            transforms.resize_into(pixels, plan, slot_pixels[slot])
            failed.append(False)
            labels.append(record.label)
        images = slots.permute(0, 3, 1, 2)
        if not bad_keys:
            return Batch(images, torch.tensor(labels, dtype=torch.int64), bad_keys)
        order = filled_order(failed)
        if not order:
            return Batch(torch.empty(0, dtype=torch.uint8), _no_labels(), bad_keys)
        return Batch(
            images[order], torch.tensor([labels[i] for i in order], dtype=torch.int64), bad_keys
        )

    @staticmethod
    def failed(key: bytes, outside_label: int | None = None) -> Sample:
        return Sample(None, -1, key, outside_label)

    @staticmethod
    def collate(samples: Sequence[Sample] | Batch) -> Batch:
        """Stack a batch, its failed records' places filled with copies of good samples; a Batch
        that `batch` already made passes through."""
        if isinstance(samples, Batch):
            return samples
        order = filled_order([sample.bad_key is not None for sample in samples])
        bad_keys = [sample.bad_key for sample in samples if sample.bad_key is not None]
        outside = first_label_outside(samples)
        if not order:
            return Batch(torch.empty(0, dtype=torch.uint8), _no_labels(), bad_keys, outside)
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

    def _decode(
        self, record: Record, key: bytes, plan_for: transforms.PlanFor
    ) -> tuple[np.ndarray, transforms.CropPlan]:
        """The decoded image (HWC uint8, perhaps only the crop's box) and the crop in its pixels;
        RecordError if it cannot be decoded."""
        decoded = self._decode_jpeg(record, key, plan_for)
        if decoded is not None:
            return decoded
        # Raw pixels, PNG, CMYK, or a JPEG libjpeg-turbo refused (draft mode): planned for the
        # image as decoded, so a drafted one is cropped in its own pixels.
        pixels = transforms.pil_to_hwc(
            decode_image(record, self.num_channels, draft_size=self.draft_size)
        )
        return pixels, plan_for(pixels.shape[1], pixels.shape[0], False).crop

    def _decode_jpeg(
        self, record: Record, key: bytes, plan_for: transforms.PlanFor
    ) -> tuple[np.ndarray, transforms.CropPlan] | None:
        """HWC uint8 of the plan's box of a gray or colour JPEG, DCT-scaled down as far as the plan
        allows and decoded alone (jpeg_region), and the crop in its pixels (the whole of it); None
        for anything else, and for a JPEG libjpeg-turbo refuses, which Pillow then gets to judge
        as before."""
        frame = jpeg_header(record.encoded)
        if frame is None or record.encoded is None:  # a JPEG header is only read from file bytes
            return None
        plan = plan_for(frame.width, frame.height, True)
        try:
            pixels = decode_jpeg_box(
                record.encoded, frame.size, self.num_channels, plan.reduction, plan.crop.box
            )
        except RecordError as error:
            log.debug("record %r: %s; trying Pillow", key, error)
            return None
        height, width = pixels.shape[:2]
        return pixels, transforms.CropPlan((0, 0, width, height), plan.crop.mirror)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """torch on one thread while a batch is made: its per-image operations are too small to share
    out, and in a training process of 2 threads on a busy machine sharing them made the batches
    of --num_workers 0 five times slower (docs/speed.md). Input processes have one already."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _batch_tensor(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised uint8 tensor, in shared memory inside an input process (as the
    DataLoader's default_collate allocates), where handing it over would otherwise copy it there."""
    if get_worker_info() is None:
        return torch.empty(shape, dtype=torch.uint8)
    storage = torch.UntypedStorage._new_shared(int(torch.Size(shape).numel()))
    return torch.empty(0, dtype=torch.uint8).set_(storage).view(shape)


def _no_labels() -> torch.Tensor:
    return torch.empty(0, dtype=torch.int64)
