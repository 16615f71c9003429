"""Whether quasi-random order mixes a DB's labels: a DB made without --shuffle is in label order,
and a batch drawn from a window of a few runs would hold few classes. Even where each batch holds
as many classes as a random one, a window smaller than such a DB holds a changing part of its
classes for all of its batches, which cost test accuracy in our measurement (docs/data.md).

Checked once at start from samples of labels, read from the records' wire format: the first
batch of the order's first pass, as many records spread evenly over the DB (which, whatever
the DB's order, stand for its label distribution), and each one's neighbour in key order (which
shares its label far more often than chance in a DB in label order)."""

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


def in_label_order(pairs: Sequence[tuple[int | None, int | None]]) -> bool:
    """Whether neighbouring records (`pairs` of their labels; None: unread) share a label more
    than halfway from a shuffled DB's rate (the sum of the squared label shares) to always."""
    read = [(one, other) for one, other in pairs if one is not None and other is not None]
    if not read:
        return False
    labels = Counter(label for pair in read for label in pair)
    shares = np.array(list(labels.values())) / (2 * len(read))
    chance = float(np.sum(shares**2))
    same = sum(one == other for one, other in read) / len(read)
    return same > (1 + chance) / 2


def poor_mix_warning(
    path: str, db_type: str, keys: Sequence[bytes], order: RecordOrder, window_mb: int, batch: int
) -> str | None:
    """The start's one line when `order`'s batches of `batch` would hold too few labels, or its
    windows are smaller than a DB in label order; None when neither, or when the order is random
    or one window (a full shuffle), where nothing is read."""
    if order.run_length == 1 or len(keys) <= order.run_length * order.window_runs:
        return None
    size = min(batch, SAMPLE, len(keys))
    spread = np.linspace(0, len(keys) - 2, size).round().astype(int).tolist()
    with open_database(path, db_type) as database:

        def labels_of(indices: list[int]) -> list[int | None]:
            return [quick_label(database.view(keys[index])) for index in indices]

        first_batch = [
            label for label in labels_of(order.records_at(range(size))) if label is not None
        ]
        pairs = list(zip(labels_of(spread), labels_of([index + 1 for index in spread])))
    spread_labels = [label for label, _ in pairs if label is not None]
    held, expected = len(set(first_batch)), expected_labels(spread_labels, len(first_batch))
    windows = f"{window_mb} MB ({order.window_runs} runs of {order.run_length} records)"
    if held < POOR_MIX * expected:
        return (
            f"--read_order quasi_random mixes this DB's labels poorly: a batch of {size} holds "
            f"{held} labels where a random batch would hold about {expected:.0f}, since the DB "
            f"is in label order and a window of {windows} cannot mix it: {_FIXES}"
        )
    if in_label_order(pairs):
        return (
            "--read_order quasi_random reads this DB, which is in label order, in windows of "
            f"{windows} smaller than it: each window's batches draw on a changing part of its "
            f"labels, which cost test accuracy in our measurement (docs/data.md): {_FIXES}"
        )
    return None


_FIXES = (
    "raise --read_window_mb, read it with --read_order random where it fits in memory, or "
    "rebuild it in shuffled order with resnet50-db copy --shuffle (or create --shuffle)"
)
