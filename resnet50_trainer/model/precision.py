"""Training precision and memory layout: autocast, the gradient scaler, TF32 and channels_last.

How the original's flags map onto PyTorch (docs/speed.md):
- --dtype float16: autocast to float16 with a gradient scaler. The original kept float16 weights
  with float32 master copies; autocast keeps float32 weights and runs conv/fc in float16, which is
  the same arithmetic with the master copy being the weights themselves.
- --float16_compute: the original's "do the conv/fc arithmetic in float16". Under autocast that is
  exactly what --dtype float16 does, so it selects the same mode.
- --dtype bfloat16: autocast to bfloat16, no scaler (bfloat16 has float32's exponent range).
- --enable_tensor_core: TF32 for matmuls and cuDNN convolutions, and channels_last tensors (the
  layout tensor-core convolutions run on without transposes). GPU only; without it, neither
  (PyTorch's own default lets cuDNN's convolutions use TF32).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from resnet50_trainer.config.settings import Config

# The original normalised pixels as (x - 128) / 128.
PIXEL_CENTRE = 128.0
PIXEL_SCALE = 128.0


@dataclass(frozen=True)
class PrecisionSettings:
    dtype: str  # --dtype, with --float16_compute folded in: float, float16 or bfloat16
    tensor_cores: bool  # --enable_tensor_core: TF32 and channels_last
    # --image_mean_per_channel and --image_std_per_channel in the original's BGR order
    mean_per_channel: tuple[float, ...]
    std_per_channel: tuple[float, ...]

    @classmethod
    def of(cls, config: Config) -> PrecisionSettings:
        # --float16_compute is the original's "conv/fc arithmetic in float16": --dtype float16.
        dtype = "float16" if config.float16_compute else config.dtype
        return cls(
            dtype,
            config.enable_tensor_core,
            tuple(config.image_mean_per_channel or (PIXEL_CENTRE,) * config.num_channels),
            tuple(config.image_std_per_channel or (PIXEL_SCALE,) * config.num_channels),
        )


def describe_precision(settings: PrecisionSettings, device: torch.device) -> str:
    """The start line's words: the arithmetic, the layout and where, e.g. "bfloat16 autocast,
    channels_last and TF32 on cuda:0"."""
    arithmetic = {
        "float16": "float16 autocast with a gradient scaler",
        "bfloat16": "bfloat16 autocast",
    }.get(settings.dtype, "float32")
    layout = ", channels_last and TF32" if settings.tensor_cores else ""
    where = "the CPU" if device.type == "cpu" else str(device)
    return f"{arithmetic}{layout} on {where}"


def compute_dtype(settings: PrecisionSettings) -> torch.dtype | None:
    """The autocast dtype of the run, or None for plain float32."""
    return {"float16": torch.float16, "bfloat16": torch.bfloat16}.get(settings.dtype)


def normalize(
    images: torch.Tensor,
    dtype: torch.dtype = torch.float32,
    mean: torch.Tensor | float = PIXEL_CENTRE,
    std: torch.Tensor | float = PIXEL_SCALE,
) -> torch.Tensor:
    """uint8 NCHW on the device -> (x - mean) / std in `dtype`; mean and std per channel as
    (1, C, 1, 1) tensors, or one number for all. Worked in float32 and then cast, so the
    original's (x - 128) / 128 is exact in float16 and bfloat16 too."""
    return images.float().sub_(mean).div_(std).to(dtype)


def channel_statistics(
    settings: PrecisionSettings, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean and std per channel as (1, C, 1, 1) tensors in our tensors' channel order: the
    flags follow the original's BGR, our colour tensors are RGB."""
    mean, std = (
        torch.tensor(values[::-1], device=device).view(1, -1, 1, 1)
        for values in (settings.mean_per_channel, settings.std_per_channel)
    )
    return mean, std


class Precision:
    """What the training step needs to know about precision and layout, for one device."""

    def __init__(self, settings: PrecisionSettings, device: torch.device):
        self.settings, self.device = settings, device
        self.dtype = compute_dtype(settings)
        self.channels_last = settings.tensor_cores
        self.mean, self.std = channel_statistics(settings, device)
        # A disabled scaler passes backward() and step() straight through.
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.dtype is torch.float16)
        if device.type == "cuda":
            # Both ways: cuDNN's convolutions default to TF32 in PyTorch, so float32 without the
            # flag would quietly run them at TF32's 10-bit mantissa.
            torch.backends.cuda.matmul.allow_tf32 = settings.tensor_cores
            torch.backends.cudnn.allow_tf32 = settings.tensor_cores

    def autocast(self):
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model.to(memory_format=torch.channels_last) if self.channels_last else model

    def inputs(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 NCHW on the device, in either memory layout (the CPU input path's batches are
        channels-last) -> normalised, in the compute dtype and the model's layout."""
        layout = torch.channels_last if self.channels_last else torch.contiguous_format
        images = images.contiguous(memory_format=layout)
        return normalize(images, self.dtype or torch.float32, self.mean, self.std)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        self.scaler.step(optimizer)
        self.scaler.update()
