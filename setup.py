"""The compiled modules, both optional: region-of-interest JPEG decoding against the system
libjpeg(-turbo) (data/formats/_jpeg_region.c; without a compiler or libjpeg's headers whole frames
are decoded, data/formats/jpeg_region.py says which) and the crops' resize (data/_resample.c;
without a compiler PyTorch's operator makes the same pixels, data/transforms.py)."""

from __future__ import annotations

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "resnet50_trainer.data.formats._jpeg_region",
            ["resnet50_trainer/data/formats/_jpeg_region.c"],
            depends=["resnet50_trainer/data/_buffers.h"],
            libraries=["jpeg"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "resnet50_trainer.data._resample",
            ["resnet50_trainer/data/_resample.c"],
            depends=["resnet50_trainer/data/_buffers.h"],
            # PyTorch's weight expressions, unfused: a fused multiply-add rounds differently.
            extra_compile_args=["-O2", "-ffp-contract=off"],
            optional=True,
        ),
    ]
)
