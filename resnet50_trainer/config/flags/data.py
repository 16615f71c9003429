"""The data flags: the training and test databases, their type, the labels, the test's size and the
share of bad records an epoch may skip. Part of the one parser (parser.py)."""

from __future__ import annotations

from resnet50_trainer.config.flags.declare import FlagGroup, flag, flag_group
from resnet50_trainer.config.values import (
    NUM_LABELS,
    Number,
    path_value,
)
from resnet50_trainer.data.formats.db_types import DB_TYPES, LMDB
from resnet50_trainer.data.settings import (
    AUTO_ORDER,
    DEFAULT_WINDOW_MB,
    READ_ORDERS,
    RUN_BYTES,
)

# The trainer's, and resnet50-db bench's (tools/db/bench.py).
READ_ORDER_FLAGS = ("read_order", "read_window_mb")
SYNTHETIC_DATA = "null"  # --train_data's word for synthetic data


def training_data(text: str) -> str:
    """--train_data: a DB's path, or the word for synthetic data."""
    return text if text == SYNTHETIC_DATA else path_value(text)


@flag_group
class DataFlags(FlagGroup):
    TITLE = "data"

    train_data: str = flag(type=training_data, required=True)
    """path of the training DB; the word 'null' trains on synthetic data"""
    test_data: str | None = flag(type=path_value)
    """path of the test DB, evaluated after every epoch"""
    db_type: str = flag(if_absent=LMDB, choices=DB_TYPES)
    """database type"""
    num_labels: int = flag(type=NUM_LABELS, if_absent=1000)
    """number of classes"""
    # As given: auto is resolved with the DB (train/inputs._agreed_read_order).
    read_order: str = flag(
        if_absent=AUTO_ORDER,
        choices=READ_ORDERS,
        help="order of each pass over the training DB: random (any record anywhere, one "
        f"storage request a record), quasi_random (runs of consecutive records, about "
        f"{RUN_BYTES // 1024} KB each, in a random order, shuffled within windows of runs: one "
        "request a run, for a DB larger than memory or on a network disk) or auto "
        "(quasi_random when the DB is more than half of this machine's memory, else random); "
        "the start line says which and why",
    )
    # None: DEFAULT_WINDOW_MB; refused with --read_order random.
    read_window_mb: int | None = flag(
        type=Number(int, 1, 2**20),
        help="quasi_random (and auto): the records shuffled together, in MB of the DB (held in "
        "the page cache while its batches read it): larger mixes a DB more, smaller leaves more "
        f"memory (default: {DEFAULT_WINDOW_MB})",
    )
    test_epoch_size: int | None = flag(type=Number(int, 1, 10**12))
    """test images per evaluation: the first N of the test DB in key order (default: the whole test
    DB)"""
    max_bad_records: float = flag(type=Number(float, 0, 1, below_maximum=True), if_absent=0.01)
    """fraction of an epoch's records that may fail to decode (skipped and named) before the run
    stops"""
