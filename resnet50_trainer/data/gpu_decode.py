"""`--decode_device gpu`: input processes read record bytes, the training GPU decodes and crops.

An input process parses each record and reads only the JPEG header (size, colour mode), enough to
draw the crop from the same per-position RNG as the CPU path (transforms.PlanFor), and hands
over the file bytes. The training process decodes the whole batch in one call
(torchvision.io.decode_jpeg on the device, nvJPEG on CUDA), then cuts, resizes and mirrors each crop
there. Records that are raw pixels, PNG or unusual JPEGs (CMYK) fall back to the CPU path in the
input process, with one warning per run. A JPEG whose header libjpeg-turbo reads but the device
cannot decode (arithmetic-coded, lossless, 12-bit) counts as a bad record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torchvision.io import ImageReadMode, decode_jpeg

from resnet50_trainer.data import transforms
from resnet50_trainer.data.batch import Batch, filled_order
from resnet50_trainer.data.cpu_decode import CpuDecode
from resnet50_trainer.data.records import Record, jpeg_header
from resnet50_trainer.data.settings import InputSettings

log = logging.getLogger(__name__)


class EncodedSample(NamedTuple):
    jpeg: torch.Tensor | None  # the file's bytes, uint8; None when `image` holds a CPU crop
    plan: transforms.CropPlan | None
    image: torch.Tensor | None  # CHW uint8 crop decoded on the CPU (the fallback)
    label: int
    bad_key: bytes | None
    key: bytes


class EncodedBatch(NamedTuple):
    """The records that did not fail in the input processes, in order; the batch's other places
    are the bad keys', filled on the device (BatchDecoder)."""

    jpegs: list  # per record: bytes tensor, or None where cpu_images has the crop
    plans: list
    cpu_images: torch.Tensor  # K x C x S x S uint8, the records whose jpeg is None, in order
    labels: torch.Tensor
    bad_keys: list
    keys: list


class GpuDecode:
    """Records -> JPEG bytes and crop plans in the input processes -> decoded and cropped on the
    device by BatchDecoder; anything else is decoded by the CPU strategy in the input process."""

    def __init__(self, settings: InputSettings):
        self.cpu = CpuDecode(settings)
        self.num_channels, self.image_size = settings.num_channels, settings.image_size

    def sample(self, record: Record, key: bytes, plan_for: transforms.PlanFor) -> EncodedSample:
        header = jpeg_header(record)
        if header is None or record.encoded is None:  # a JPEG header is only read from file bytes
            fallback = self.cpu.sample(record, key, plan_for)
            return EncodedSample(None, None, fallback.image, record.label, None, key)
        width, height = header
        jpeg = torch.frombuffer(bytearray(record.encoded), dtype=torch.uint8)
        plan = plan_for(width, height, False).crop  # nvJPEG decodes at full size
        return EncodedSample(jpeg, plan, None, record.label, None, key)

    @staticmethod
    def failed(key: bytes) -> EncodedSample:
        return EncodedSample(None, None, None, -1, key, key)

    @staticmethod
    def collate(samples: Sequence[EncodedSample]) -> EncodedBatch:
        good = [sample for sample in samples if sample.bad_key is None]
        crops = [sample.image for sample in good if sample.image is not None]
        return EncodedBatch(
            [sample.jpeg for sample in good],
            [sample.plan for sample in good],
            torch.stack(crops) if crops else torch.empty(0, dtype=torch.uint8),
            torch.tensor([sample.label for sample in good], dtype=torch.int64),
            [sample.bad_key for sample in samples if sample.bad_key is not None],
            [sample.key for sample in good],
        )

    def stage(self, device: torch.device) -> Callable[[EncodedBatch], Batch]:
        return BatchDecoder(device, self.num_channels, self.image_size)


class BatchDecoder:
    """EncodedBatch -> Batch on `device`: decode the JPEGs together, then crop each one there."""

    def __init__(self, device: torch.device, num_channels: int, image_size: int):
        self.device, self.image_size = device, image_size
        self.mode = ImageReadMode.RGB if num_channels == 3 else ImageReadMode.GRAY
        self.shape = (num_channels, image_size, image_size)
        self.warned = False

    def __call__(self, batch: EncodedBatch) -> Batch:
        """The decoded records first, then copies of them (with labels) in failed ones' places."""
        images = torch.empty(
            (len(batch.jpegs),) + self.shape, dtype=torch.uint8, device=self.device
        )
        on_device = [i for i, jpeg in enumerate(batch.jpegs) if jpeg is not None]
        on_cpu = [i for i, jpeg in enumerate(batch.jpegs) if jpeg is None]
        if on_cpu:
            self._warn_once(len(on_cpu), len(batch.jpegs))
            images[on_cpu] = batch.cpu_images.to(self.device, non_blocking=True)
        bad_keys = list(batch.bad_keys)
        decoded = self._decode(
            [batch.jpegs[i] for i in on_device], [batch.keys[i] for i in on_device], bad_keys
        )
        for i, image in zip(on_device, decoded):
            if image is not None:
                images[i] = transforms.resize_crop(image, batch.plans[i], self.image_size)
        labels = batch.labels.to(self.device, non_blocking=True)
        if len(bad_keys):  # the input processes' failures take the places after these records'
            failed = {i for i, image in zip(on_device, decoded) if image is None}
            order = filled_order(
                [i in failed for i in range(len(images))] + [True] * len(batch.bad_keys)
            )
            images, labels = images[order], labels[order]  # empty when every record failed
        return Batch(images, labels, bad_keys)

    def _decode(self, jpegs: list, keys: list, bad_keys: list) -> list:
        """CHW uint8 images decoded on the device; None (its key in bad_keys) where one fails."""
        if not jpegs:
            return []
        try:
            return list(decode_jpeg(jpegs, mode=self.mode, device=self.device))
        except RuntimeError:
            pass  # one bad file fails the whole call: find it by decoding one at a time
        decoded = []
        for jpeg, key in zip(jpegs, keys):
            try:
                decoded.append(decode_jpeg(jpeg, mode=self.mode, device=self.device))
            except RuntimeError as error:
                log.debug("record %r: %s", key, error)
                bad_keys.append(key)
                decoded.append(None)
        return decoded

    def _warn_once(self, count: int, total: int) -> None:
        if not self.warned:
            log.warning(
                "%d of %d records of a batch are raw pixels, PNG or non-RGB JPEG: the "
                "input processes decode those on the CPU (--decode_device gpu decodes "
                "only JPEG)",
                count,
                total,
            )
            self.warned = True
