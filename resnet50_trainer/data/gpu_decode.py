"""`--decode_device gpu`: input processes read record bytes, the training GPU decodes and crops.

An input process parses each record and reads only the JPEG header (size, colour mode), enough to
draw the crop from the same per-position RNG as the CPU path (transforms.PlanFor), and hands
over the file bytes. The training process decodes the whole batch in one call
(torchvision.io.decode_jpeg on the device, nvJPEG on CUDA), then cuts, resizes and mirrors each crop
there. Records that are raw pixels, PNG or JPEGs nvJPEG does not take (CMYK, lossless,
arithmetic-coded) fall back to the CPU path in the input process, with one warning per run; so does
a JPEG whose body is cut short, for the CPU path to judge (nvJPEG's hardware decoder may not fail
on it). A JPEG the device fails on counts as a bad record.

A batch travels as one tensor of file bytes (one buffer for the loader to pin, not one a record).
On CUDA the decode waits for the calling stream to be idle: torchvision's decoder allocates its
outputs on that stream but writes them from its own, so it could be handed memory that kernels
queued there still read (pytorch/vision PR #9606). Only errors of a record are counted as bad
records; the device's own (out of memory, CUDA errors, a torchvision without nvJPEG) stop the run.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch
from torchvision.io import ImageReadMode, decode_jpeg, encode_jpeg
from torchvision.transforms.v2 import functional

from resnet50_trainer.data import transforms
from resnet50_trainer.data.batch import Batch, Fetched, filled_order, first_label_outside
from resnet50_trainer.data.cpu_decode import CpuDecode
from resnet50_trainer.data.formats.images import jpeg_header, luma
from resnet50_trainer.data.formats.jpeg_region import ends_complete
from resnet50_trainer.data.formats.records import Record
from resnet50_trainer.data.settings import InputSettings
from resnet50_trainer.data.spans import DECODE_ON_GPU
from resnet50_trainer.errors import RecordError, UserError

log = logging.getLogger(__name__)
# Errors of the device, of torchvision or of torch's sync debug mode, not of one record: they stop
# the run.
DEVICE_FAILURES = (
    "CUDA error",
    "out of memory",
    "not compiled with",
    "called a synchronizing CUDA operation",
)


class EncodedSample(NamedTuple):
    jpeg: bytes | memoryview | None  # the file's bytes; None when `image` holds a CPU crop
    plan: transforms.CropPlan | None
    image: torch.Tensor | None  # CHW uint8 crop decoded on the CPU (the fallback)
    label: int
    bad_key: bytes | None
    key: bytes
    outside_label: int | None = None  # as Sample's


class EncodedBatch(NamedTuple):
    """The records that did not fail in the input processes, in order; the batch's other places
    are the bad keys', filled on the device (BatchDecoder)."""

    encoded: (
        torch.Tensor
    )  # uint8: the file bytes of the records decoded on the device, back to back
    spans: list  # per record: (start, end) of its bytes in `encoded`; None where cpu_images has it
    plans: list
    cpu_images: torch.Tensor  # K x C x S x S uint8, the records whose span is None, in order
    labels: torch.Tensor
    bad_keys: list
    keys: list
    label_outside: tuple[bytes, int] | None = None  # as Batch's


class GpuDecode:
    """Records -> JPEG bytes and crop plans in the input processes -> decoded and cropped on the
    device by BatchDecoder; anything else is decoded by the CPU strategy in the input process."""

    STAGE_SPAN = DECODE_ON_GPU

    def __init__(self, settings: InputSettings):
        self.cpu = CpuDecode(settings)
        self.num_channels, self.image_size = settings.num_channels, settings.image_size

    def sample(self, record: Record, key: bytes, plan_for: transforms.PlanFor) -> EncodedSample:
        frame = jpeg_header(record.encoded)
        # A cut file is the CPU decoder's to judge; nvJPEG decodes no arithmetic-coded one.
        if (
            frame is None
            or record.encoded is None
            or frame.arithmetic
            or not ends_complete(record.encoded)
        ):
            fallback = self.cpu.sample(record, key, plan_for)
            return EncodedSample(None, None, fallback.image, record.label, None, key)
        width, height = frame.size
        plan = plan_for(width, height, False).crop  # nvJPEG decodes at full size
        # A view of the record (no copy): collate copies the batch's files into one buffer.
        return EncodedSample(record.encoded, plan, None, record.label, None, key)

    @staticmethod
    def failed(key: bytes, outside_label: int | None = None) -> EncodedSample:
        return EncodedSample(None, None, None, -1, key, key, outside_label)

    def batch(self, fetched: Sequence[Fetched]) -> EncodedBatch:
        return self.collate(
            [
                self.failed(key) if record is None else self._sample_or_failed(record, key, plan)
                for record, key, plan in fetched
            ]
        )

    def _sample_or_failed(
        self, record: Record, key: bytes, plan_for: transforms.PlanFor
    ) -> EncodedSample:
        try:
            return self.sample(record, key, plan_for)
        except RecordError as error:  # only the CPU fallback decodes here
            log.debug("record %r: %s", key, error)
            return self.failed(key)

    @staticmethod
    def collate(samples: Sequence[EncodedSample] | EncodedBatch) -> EncodedBatch:
        """The samples as one EncodedBatch; one that `batch` already made passes through."""
        if isinstance(samples, EncodedBatch):
            return samples
        good = [sample for sample in samples if sample.bad_key is None]
        crops = [sample.image for sample in good if sample.image is not None]
        spans, start = [], 0
        for sample in good:
            end = start + len(sample.jpeg) if sample.jpeg is not None else start
            spans.append((start, end) if sample.jpeg is not None else None)
            start = end
        files = bytearray().join(sample.jpeg for sample in good if sample.jpeg is not None)
        return EncodedBatch(
            torch.frombuffer(files, dtype=torch.uint8) if files else _no_bytes(),
            spans,
            [sample.plan for sample in good],
            torch.stack(crops) if crops else _no_bytes(),
            torch.tensor([sample.label for sample in good], dtype=torch.int64),
            [sample.bad_key for sample in samples if sample.bad_key is not None],
            [sample.key for sample in good],
            first_label_outside(samples),
        )

    def stage(self, device: torch.device) -> Callable[[EncodedBatch], Batch]:
        return BatchDecoder(device, self.num_channels, self.image_size)


class BatchDecoder:
    """EncodedBatch -> Batch on `device`: decode the JPEGs together, then crop them there, in one
    resize per crop size. On CUDA, nvJPEG is tried once at start (UserError if it cannot run)."""

    def __init__(self, device: torch.device, num_channels: int, image_size: int):
        self.device, self.image_size = device, image_size
        self.gray = num_channels == 1
        self.shape = (num_channels, image_size, image_size)
        self.warned = False
        if device.type == "cuda":
            self._probe()

    def __call__(self, batch: EncodedBatch) -> Batch:
        """The decoded records first, then copies of them (with labels) in failed ones' places.
        The batch is stacked from each record's image in one copy: indexing with a list would copy
        the index to the device and wait for it, a host sync a batch beyond the decode's."""
        on_device = [i for i, span in enumerate(batch.spans) if span is not None]
        on_cpu = [i for i, span in enumerate(batch.spans) if span is None]
        bad_keys = list(batch.bad_keys)
        # First, while the calling stream has the least queued on it (see _decode_now).
        decoded = self._decode(
            [batch.encoded[slice(*batch.spans[i])] for i in on_device],
            [batch.keys[i] for i in on_device],
            bad_keys,
        )
        places: dict[int, torch.Tensor] = {}  # each record's image, but those failed here
        if on_cpu:
            self._warn_once(len(on_cpu), len(batch.spans))
            cpu_images = batch.cpu_images.to(self.device, non_blocking=True)
            for i, image in zip(on_cpu, cpu_images):
                places[i] = image
        kept = [(i, image) for i, image in zip(on_device, decoded) if image is not None]
        self._crop_into(places, kept, batch.plans)
        # The input processes' failures take the places after these records'.
        failed = [i not in places for i in range(len(batch.spans))] + [True] * len(batch.bad_keys)
        order = filled_order(failed)
        # Reordered on the host (rare: a record failed): a list index on the device would wait.
        labels = (batch.labels[order] if bad_keys else batch.labels).to(
            self.device, non_blocking=True
        )
        if order:
            images = torch.stack([places[i] for i in order])
        else:  # every record failed
            images = torch.empty((0,) + self.shape, dtype=torch.uint8, device=self.device)
        return Batch(images, labels, bad_keys, batch.label_outside)

    def _crop_into(self, places: dict, kept: list, plans: list) -> None:
        """Cut each plan's box into its place; boxes of one size are resized and mirrored together
        (the same arithmetic per image as transforms.resize_crop, in fewer kernel launches)."""
        by_size: dict[tuple, list] = {}
        for i, image in kept:
            left, top, right, bottom = plans[i].box
            cut = image[:, top:bottom, left:right]
            by_size.setdefault(tuple(cut.shape), []).append((i, cut))
        for group in by_size.values():
            resized = functional.resize(
                torch.stack([cut for _, cut in group]), [self.image_size] * 2, antialias=True
            )
            mirrored = resized.flip(-1) if any(plans[i].mirror for i, _ in group) else resized
            for n, (i, _) in enumerate(group):
                places[i] = mirrored[n] if plans[i].mirror else resized[n]

    def _decode(self, jpegs: list, keys: list, bad_keys: list) -> list:
        """CHW uint8 images decoded on the device; None (its key in bad_keys) where one fails."""
        if not jpegs:
            return []
        try:
            return self._decode_now(jpegs)
        except RuntimeError as error:
            raise_unless_record_failure(error)  # one bad file fails the whole call
        decoded = []
        for jpeg, key in zip(jpegs, keys):  # find the bad ones by decoding one at a time
            try:
                decoded.append(self._decode_now([jpeg])[0])
            except RuntimeError as error:
                raise_unless_record_failure(error)
                log.debug("record %r: %s", key, error)
                bad_keys.append(key)
                decoded.append(None)
        return decoded

    def _decode_now(self, jpegs: list) -> list:
        with _device_idle_first(self.device):
            decoded = list(decode_jpeg(jpegs, mode=ImageReadMode.RGB, device=self.device))
        if self.gray:  # gray as on every path (images.luma), not nvJPEG's Y
            return [luma(*image.int()).to(torch.uint8)[None] for image in decoded]
        return decoded

    def _probe(self) -> None:
        """Decode a tiny JPEG once, so that a torchvision without nvJPEG or an nvJPEG that cannot
        start is one line at start, not a run of bad records."""
        tiny = encode_jpeg(torch.zeros((3, 8, 8), dtype=torch.uint8))
        try:
            self._decode_now([tiny])
            torch.cuda.synchronize(self.device)
        except RuntimeError as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
            raise UserError(
                f"--decode_device gpu: nvJPEG cannot decode on {self.device} ({reason}): "
                "use --decode_device cpu"
            ) from None

    def _warn_once(self, count: int, total: int) -> None:
        if not self.warned:
            log.warning(
                "%d of %d records of a batch are raw pixels, PNG or JPEGs nvJPEG does not take "
                "(CMYK, lossless, arithmetic-coded, incomplete): the input processes decode those "
                "on the CPU",
                count,
                total,
            )
            self.warned = True


@contextlib.contextmanager
def _device_idle_first(device: torch.device) -> Iterator[None]:
    """On CUDA, wait for the device's current stream before the block: torchvision's decoder
    writes from its own stream into memory allocated on this one, so nothing queued here may still
    read memory the allocator could hand it (vision PR #9606). A host wait by design, once a batch,
    and so is the decode's own wait for nvJPEG's stream: torch's sync debug mode, where set (by
    users and tests/gpu, to find the waits nobody meant), is off for the whole block. Set only
    then: any setting prints torch's "prototype feature" warning."""
    if device.type != "cuda":
        yield
        return
    mode = torch.cuda.get_sync_debug_mode()
    if mode:
        torch.cuda.set_sync_debug_mode(0)
    try:
        torch.cuda.current_stream(device).synchronize()
        yield
    finally:
        if mode:
            torch.cuda.set_sync_debug_mode(mode)


def _no_bytes() -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8)


def raise_unless_record_failure(error: RuntimeError) -> None:
    """Re-raise what the device or torchvision failed on: out of memory, a CUDA error (sticky: the
    process cannot go on), a build without nvJPEG. Anything else is the record's."""
    accelerator_error = getattr(torch, "AcceleratorError", ())
    if isinstance(error, (torch.OutOfMemoryError, accelerator_error)):
        raise error
    if any(marker in str(error) for marker in DEVICE_FAILURES):
        raise error
