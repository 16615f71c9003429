"""The inputs an export is checked on: a DB's first images preprocessed as the trainer's test
images are (the same decode, resize and centre crop), or seeded random ones."""

from __future__ import annotations

import torch

from resnet50_trainer.data.cpu_decode import CpuDecode
from resnet50_trainer.data.dataset import ImageRecords
from resnet50_trainer.data.formats.databases import detect_db_type, open_database
from resnet50_trainer.data.formats.db_types import LMDB
from resnet50_trainer.data.formats.keys import printable_key
from resnet50_trainer.data.settings import InputSettings
from resnet50_trainer.errors import UserError
from resnet50_trainer.model.precision import normalize
from resnet50_trainer.tools.export.network import Network

RANDOM_SEED = 0


def check_inputs(network: Network, path: str | None, count: int) -> tuple[torch.Tensor, str]:
    """A float32 NCHW batch as the network takes it, and what it is ("16 images of DB")."""
    pre = network.preprocessing
    if path is None:
        generator = torch.Generator().manual_seed(RANDOM_SEED)
        shape = (count, network.num_channels, pre.centre_crop, pre.centre_crop)
        return torch.randn(shape, generator=generator), f"{count} random inputs"
    db_type = detect_db_type(path) or LMDB  # open_database names what is wrong with the path
    with open_database(path, db_type) as database:
        keys = database.keys()[:count]
    settings = InputSettings(
        network.num_labels,
        network.num_channels,
        pre.resize_shorter_side,
        pre.centre_crop,
        seed=0,
        num_workers=0,
        decode_on_gpu=False,
    )
    decoding = CpuDecode(settings)
    records = ImageRecords(path, db_type, keys, settings, train=False, decoding=decoding)
    batch = decoding.collate([records[index] for index in range(len(keys))])
    if batch.bad_keys or not len(batch.labels):
        first = f" (the first: {printable_key(batch.bad_keys[0])})" if batch.bad_keys else ""
        raise UserError(
            f"--check_data {path}: {len(batch.bad_keys)} of its first {len(keys)} records are "
            f"no image this network reads{first}: give a DB of its images (resnet50-db inspect "
            "says why)"
        )
    mean, std = (torch.tensor(values).view(1, -1, 1, 1) for values in (pre.mean, pre.std))
    return normalize(batch.images, torch.float32, mean, std), f"{len(keys)} images of {path}"
