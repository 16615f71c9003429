"""A DB's records as the trainer's input pipeline reads them (ImageRecords), with small test
settings and either decoding."""

from __future__ import annotations

from resnet50_trainer.data.dataset import ImageRecords
from resnet50_trainer.data.formats.databases import read_keys
from resnet50_trainer.data.gpu_decode import GpuDecode
from resnet50_trainer.data.settings import InputSettings


def records_of(decoding, path, train=True, size=32, scale=40, num_channels=3, **crop):
    settings = InputSettings(
        num_labels=4,
        num_channels=num_channels,
        scale=scale,
        image_size=size,
        seed=7,
        num_workers=0,
        decode_on_gpu=decoding is GpuDecode,
        **crop,
    )
    return ImageRecords(path, "lmdb", read_keys(path, "lmdb"), settings, train, decoding(settings))
