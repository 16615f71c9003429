"""The one compiled module: region-of-interest JPEG decoding against the system libjpeg(-turbo)
(data/formats/_jpeg_region.c). Optional: without a compiler or libjpeg's headers the package
installs without it and decodes whole frames (data/formats/jpeg_region.py says which)."""

from __future__ import annotations

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "resnet50_trainer.data.formats._jpeg_region",
            ["resnet50_trainer/data/formats/_jpeg_region.c"],
            libraries=["jpeg"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ]
)
