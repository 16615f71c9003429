"""Whether quasi-random order mixes a DB's labels: a DB made without --shuffle is in label order,
and a batch drawn from a window of a few runs would hold few classes.

Checked once at start from two samples of labels, read from the records' wire format: the first
batch of the order's first pass, and as many records spread evenly over the DB (which, whatever
the DB's order, stand for its label distribution)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from resnet50_trainer.data.formats.databases import open_database
from resnet50_trainer.data.formats.label_scan import quick_label
from resnet50_trainer.data.order import RecordOrder

# Records read each way at most: about 1 s of a cold network disk's 500 reads/s for both.
SAMPLE = 256
# A first batch holding fewer labels than this share of what a random batch would: poor mix.
POOR_MIX = 0.75


def expected_labels(labels: Sequence[int], batch: int) -> float:
    """How many distinct labels a batch of `batch` random records holds, where `labels` is a
    sample of the DB's labels (classes it missed would only add to the count)."""
    shares = np.array(list(Counter(labels).values())) / max(1, len(labels))
    return float(np.sum(1 - (1 - shares) ** batch))


def poor_mix_warning(
    path: str, db_type: str, keys: Sequence[bytes], order: RecordOrder, window_mb: int, batch: int
) -> str | None:
    """The start's one line when `order`'s batches of `batch` would hold too few labels; None
    when they mix as random order's would, or when the order is random or one window (a full
    shuffle), where nothing is read."""
    if order.run_length == 1 or len(keys) <= order.run_length * order.window_runs:
        return None
    size = min(batch, SAMPLE, len(keys))
    spread = np.linspace(0, len(keys) - 1, size).round().astype(int).tolist()
    with open_database(path, db_type) as database:

        def labels_of(indices: list[int]) -> list[int]:
            labels = (quick_label(database.view(keys[index])) for index in indices)
            return [label for label in labels if label is not None]

        first_batch, spread_labels = labels_of(order.records_at(range(size))), labels_of(spread)
    held, expected = len(set(first_batch)), expected_labels(spread_labels, len(first_batch))
    if held >= POOR_MIX * expected:
        return None
    return (
        f"--read_order quasi_random mixes this DB's labels poorly: a batch of {size} holds "
        f"{held} labels where a random batch would hold about {expected:.0f}, since the DB is in "
        f"label order and a window of {window_mb} MB ({order.window_runs} runs of "
        f"{order.run_length} records) cannot mix it: raise --read_window_mb, read it with "
        "--read_order random where it fits in memory, or rebuild it in shuffled order with "
        "resnet50-db copy --shuffle (or create --shuffle)"
    )
