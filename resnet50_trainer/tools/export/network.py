"""A checkpoint's network, as the trainer scores it, and the preprocessing its input needs."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass

import torch

from resnet50_trainer.checkpoint import files as checkpoint_files
from resnet50_trainer.checkpoint import schema
from resnet50_trainer.config.flags.parser import flag_actions
from resnet50_trainer.data.settings import default_scale
from resnet50_trainer.errors import UserError
from resnet50_trainer.model.precision import PIXEL_CENTRE, PIXEL_SCALE
from resnet50_trainer.model.resnet import build_model


@dataclass(frozen=True)
class Preprocessing:
    """What an image goes through before the network, as the trainer's test images do."""

    resize_shorter_side: int
    centre_crop: int  # square side: the network's input is N x C x crop x crop
    channel_order: str  # "RGB", or "gray" for one channel
    mean: tuple[float, ...]  # per channel, in channel_order, of pixels in 0..255
    std: tuple[float, ...]
    layout: str = "NCHW float32, x = (pixel - mean) / std"

    def line(self) -> str:
        return (
            f"Preprocessing: shorter side resized to {self.resize_shorter_side}, centre crop "
            f"{self.centre_crop}x{self.centre_crop}, {self.channel_order}, pixels 0..255, "
            f"{self.layout}, mean {_numbers(self.mean)}, std {_numbers(self.std)}"
        )

    def as_metadata(self) -> dict[str, str]:
        """Flat string entries (ONNX metadata_props; a JSON file beside a TorchScript model)."""
        return {key: json.dumps(value) for key, value in asdict(self).items()}


@dataclass
class Network:
    model: torch.nn.Module  # in eval mode, on the CPU
    preprocessing: Preprocessing
    description: str  # e.g. "ResNet-50, 1000 labels, EMA weights"
    num_channels: int
    num_labels: int


# The saved settings an export reads: input, checked as the trainer's flags check them.
_READ_SETTINGS = (
    *("num_layers", "num_labels", "num_channels", "resnext_num_groups"),
    *("resnext_width_per_group", "image_size", "scale", "test_resize", "test_image_size"),
    *("image_mean_per_channel", "image_std_per_channel"),
)


def _checked_settings(path: str, arguments: dict) -> dict:
    """The checkpoint's settings that an export reads, each refused in one line where the trainer
    would refuse it on its command line (a checkpoint's arguments may have been altered)."""
    saved = {**schema.ARCHITECTURE_DEFAULTS, **arguments}
    flags = flag_actions()
    checked = {}
    for name in _READ_SETTINGS:
        value = saved.get(name)
        if value is not None:
            value = _as_flag_value(flags[name], value, f"checkpoint {path} holds --{name}")
        checked[name] = value
    return checked


def _as_flag_value(flag: argparse.Action, value: object, holder: str) -> object:
    text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    try:
        parsed = flag.type(text) if callable(flag.type) else text
    except (argparse.ArgumentTypeError, TypeError, ValueError) as error:
        reason = str(error)
    else:
        if not flag.choices or parsed in flag.choices:
            return parsed
        reason = f"use one of {', '.join(map(str, flag.choices))}"
    raise UserError(
        f"{holder} {text[:80]!r}, which resnet50-trainer refuses ({reason}): give a "
        "checkpoint written by resnet50-trainer"
    )


def _check_shapes(path: str, weights: dict, saved: dict) -> None:
    """The classifier and first convolution against the settings, before a model of the
    settings' size is built (a num_labels of millions would allocate gigabytes first)."""
    for key, axis, name in (("fc.weight", 0, "num_labels"), ("conv1.weight", 1, "num_channels")):
        tensor = weights.get(key)
        if isinstance(tensor, torch.Tensor) and tensor.dim() > axis:
            if tensor.shape[axis] != saved[name]:
                raise UserError(
                    f"checkpoint {path} holds --{name} {saved[name]} and weights for "
                    f"{tensor.shape[axis]}: give a checkpoint written by resnet50-trainer"
                )


def read_network(path: str, ema: bool) -> Network:
    state = checkpoint_files.read_checkpoint_file(path)
    saved = _checked_settings(path, state["arguments"])
    weights = schema.ema_weights(state) if ema else state["model"]
    if ema and not weights:
        raise UserError(
            f"--ema exports a checkpoint's EMA of the weights, and {path} holds none (its run "
            "had no --ema_decay): leave --ema out"
        )
    _check_shapes(path, weights, saved)
    try:
        model = build_model(
            saved["num_layers"],
            saved["num_labels"],
            saved["num_channels"],
            saved["resnext_num_groups"],
            saved["resnext_width_per_group"],
        )
        model.load_state_dict(weights)
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise UserError(
            f"checkpoint {path} holds weights that do not fit its own settings "
            f"({str(error).splitlines()[0][:200]}): give a checkpoint written by resnet50-trainer"
        ) from None
    kind = "ResNeXt" if saved["resnext_num_groups"] != 1 else "ResNet"
    return Network(
        model.eval(),
        _preprocessing(saved),
        f"{kind}-{saved['num_layers']}, {saved['num_labels']} labels"
        + (", EMA weights" if ema else ""),
        saved["num_channels"],
        saved["num_labels"],
    )


def _preprocessing(saved: dict) -> Preprocessing:
    """The test images' sizes and the normalisation of the run the checkpoint was saved by; the
    flags' per-channel values are in the original's BGR order, our tensors' in RGB."""
    image_size = saved["image_size"]
    scale = saved["scale"] or default_scale(image_size)
    channels = saved["num_channels"]
    statistics = []
    for values, default in (
        (saved.get("image_mean_per_channel"), PIXEL_CENTRE),
        (saved.get("image_std_per_channel"), PIXEL_SCALE),
    ):
        statistics.append(tuple(values or [default] * channels)[::-1])
    return Preprocessing(
        resize_shorter_side=saved["test_resize"] or scale,
        centre_crop=saved["test_image_size"] or image_size,
        channel_order="RGB" if channels == 3 else "gray",
        mean=statistics[0],
        std=statistics[1],
    )


def _numbers(values: tuple[float, ...]) -> str:
    return "[" + ", ".join(f"{value:g}" for value in values) + "]"
