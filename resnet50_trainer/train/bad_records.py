"""--max_bad_records: how many unreadable training records an epoch may skip."""

from __future__ import annotations

import logging

import torch.distributed as dist

from resnet50_trainer.config.settings import Config
from resnet50_trainer.data.formats.keys import printable_key
from resnet50_trainer.distributed import process_group
from resnet50_trainer.errors import UserError
from resnet50_trainer.path_words import shown
from resnet50_trainer.reporting.progress import BAD_KEYS_NAMED

log = logging.getLogger(__name__)


def bad_records_verdict(
    bad: int,
    images: int,
    bad_keys: list,
    epoch_number: int,
    config: Config,
    world_size: int,
    is_main: bool,
) -> UserError | None:
    """Name the epoch's count of skipped records (global; `bad_keys`: this process's first);
    above --max_bad_records, the failure that stops the run, naming the first keys of all
    processes. Every process reaches the same verdict from the global counts."""
    if not bad:
        return None
    if is_main:
        log.warning(
            "Epoch %d: %d of %d records skipped as unreadable (the first %d of each "
            "process named above)",
            epoch_number,
            bad,
            images,
            BAD_KEYS_NAMED,
        )
    share = bad / images
    if share <= config.max_bad_records:
        return None
    gathered: list = [None] * world_size
    with process_group.waiting_for_peers("the all-gather of the bad records' keys"):
        dist.all_gather_object(gathered, bad_keys)
    first = [printable_key(key) for keys in gathered for key in keys][:BAD_KEYS_NAMED]
    return UserError(
        f"{bad} of {images} records ({share:.1%}) read in epoch {epoch_number} of "
        f"{shown(config.train_data)} could not be read (first: {', '.join(first)}), above "
        f"--max_bad_records {config.max_bad_records}: repair the DB (resnet50-db "
        "inspect names them) or raise --max_bad_records"
    )
