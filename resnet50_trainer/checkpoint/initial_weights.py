"""Weights a run starts from (--init_model) or evaluates (--test_only), read by the first process
alone and loaded into its replica before DDP wraps it: DDP's broadcast at construction hands them
to every other process, so all hold the same weights even where machines hold different files.

--init_model takes one of our checkpoints (its model) or a torchvision-format state dict
(torch.save(model.state_dict())), loaded with weights_only=True."""

from __future__ import annotations

import logging
import os

import torch

from resnet50_trainer.checkpoint.files import NotRegularFileError, describe_error, load_weights_file
from resnet50_trainer.checkpoint.schema import model_problem
from resnet50_trainer.config.settings import Config
from resnet50_trainer.errors import UserError
from resnet50_trainer.model.finite import non_finite_tensors
from resnet50_trainer.path_words import denied, shown

log = logging.getLogger(__name__)
CLASSIFIER = "fc."  # torchvision's final layer: the one part a new --num_labels replaces
_FILES_READ = "one of our .pt checkpoints or a torch.save(model.state_dict()) file"


def read_init_model(path: str, config: Config, say: bool = True) -> dict[str, torch.Tensor]:
    """The weights of `path` for this run's model. A classifier of another label count is left
    out, so the model keeps its freshly initialised one (said in one line when `say`)."""
    weights = _load_named_tensors(path)
    non_finite = non_finite_tensors(weights)
    if non_finite:
        raise UserError(
            f"--init_model {shown(path)} has non-finite values in {non_finite[0]}: give weights "
            "that are all finite (an earlier checkpoint of that run, before it diverged)"
        )
    from resnet50_trainer.model.resnet import model_shapes  # as in claim.py: torchvision

    ours = model_shapes(config).state_dict()
    file_labels = _classifier_labels(weights)
    replaced = file_labels is not None and file_labels != config.num_labels
    if replaced:
        weights = _without_classifier(weights)
        ours = _without_classifier(ours)
    problem = model_problem(weights, ours)
    if problem:
        raise UserError(
            f"--init_model {shown(path)} has {problem}: give weights of a "
            f"ResNet-{config.num_layers} "
            f"with {config.num_channels} input channel(s), or set --num_layers and "
            "--num_channels to the file's"
        )
    if say:
        log.info(
            "A new run from the weights of --init_model %s%s",
            path,
            f": its classifier has {file_labels} classes, this run's {config.num_labels}: fc is "
            "replaced by a freshly initialised one"
            if replaced
            else "",
        )
    return weights


def _load_named_tensors(path: str) -> dict[str, torch.Tensor]:
    if os.path.isdir(path):
        raise UserError(f"--init_model {shown(path)} is a directory: give {_FILES_READ}")
    try:
        loaded = load_weights_file(path)
    except NotRegularFileError:
        raise UserError(
            f"--init_model {shown(path)} is not a regular file: give {_FILES_READ}"
        ) from None
    except FileNotFoundError:
        raise UserError(f"--init_model {shown(path)} does not exist: give {_FILES_READ}") from None
    except PermissionError:
        raise UserError(
            f"--init_model {shown(path)} cannot be read: {denied('read', path)}"
        ) from None
    except Exception as error:  # torch raises several types for a file that holds no weights
        raise UserError(
            f"--init_model {shown(path)} is not a PyTorch weights file ({describe_error(error)}): "
            f"give {_FILES_READ} (Caffe2 .mdl files are not read)"
        ) from None
    if isinstance(loaded, dict) and isinstance(loaded.get("model"), dict):
        loaded = loaded["model"]  # one of our checkpoints
    if not (
        isinstance(loaded, dict)
        and loaded
        and all(
            isinstance(name, str) and isinstance(value, torch.Tensor)
            for name, value in loaded.items()
        )
    ):
        raise UserError(
            f"--init_model {shown(path)} holds no state dict of named tensors: give {_FILES_READ}"
        )
    return loaded


def _classifier_labels(weights: dict[str, torch.Tensor]) -> int | None:
    """The classes of the file's classifier, or None when it has no fc of torchvision's form."""
    fc_weight, fc_bias = weights.get(CLASSIFIER + "weight"), weights.get(CLASSIFIER + "bias")
    if fc_weight is None or fc_bias is None or fc_weight.dim() != 2 or fc_bias.dim() != 1:
        return None
    return fc_weight.shape[0]


def _without_classifier(weights: dict) -> dict:
    return {name: value for name, value in weights.items() if not name.startswith(CLASSIFIER)}
