"""ImageNet-scale costs of the input side (DBs from benchmarks/make_scale_db.py).

memory DB: the key list's memory in an input process. The training process reads the keys, forks
  a child as the DataLoader does, the child reads every key (as input processes do over an epoch)
  and reports its private (USS) and proportional (PSS) memory from /proc/self/smaps_rollup, once
  for the keys as a list of bytes objects (as before) and once as the trainer's KeyStore.
labels DB [--cold]: seconds the test-label scan takes over the whole DB, the same scan parsing
  every record in full (as before it), and the preflight's check (the scan for at most
  preflight.LABEL_SCAN_S seconds, the first test checking the rest); --cold first evicts the
  DB's files from the page cache (posix_fadvise DONTNEED on those files alone), as on a machine
  that has not read them lately.
The time to the first step and the preflight at this scale are declared figures
(benchmarks/startup.py: `python -m benchmarks run --only first_step preflight`).

Usage: python -m benchmarks.scale memory|labels DB [--db_type lmdb] [--cold]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.startup import evict
from resnet50_trainer.data.formats.databases import open_database, read_keys
from resnet50_trainer.data.formats.db_types import LMDB
from resnet50_trainer.data.formats.records import parse_record
from resnet50_trainer.errors import RecordError
from resnet50_trainer.launch.preflight import LABEL_SCAN_S, _check_test_labels


def memory_kib() -> dict[str, int]:
    """This process's Rss, Pss and USS (private clean + dirty) in KiB."""
    fields = {}
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            name, _, rest = line.partition(":")
            if rest.strip().endswith("kB"):
                fields[name] = int(rest.split()[0])
    uss = fields["Private_Clean"] + fields["Private_Dirty"]
    return {"rss": fields["Rss"], "pss": fields["Pss"], "uss": uss}


def _read_every_key(keys: Sequence[bytes], results) -> None:
    before = memory_kib()
    total = sum(len(keys[index]) for index in range(len(keys)))
    after = memory_kib()
    results.put((total, {name: after[name] - before[name] for name in after}, after))


def child_memory(keys: Sequence[bytes]) -> tuple[dict[str, int], dict[str, int]]:
    """(growth while reading every key, totals after) of a forked child, in KiB."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_read_every_key, args=(keys, results))
    child.start()
    _, growth, totals = results.get()
    child.join()
    return growth, totals


def report_memory(name: str, keys: Sequence[bytes]) -> None:
    growth, totals = child_memory(keys)
    print(
        f"{name}: {len(keys)} keys; the child grew by USS {growth['uss'] / 1024:.1f} MiB, "
        f"PSS {growth['pss'] / 1024:.1f} MiB, RSS {growth['rss'] / 1024:.1f} MiB reading every "
        f"key; its totals: USS {totals['uss'] / 1024:.1f} MiB, PSS {totals['pss'] / 1024:.1f} MiB, "
        f"RSS {totals['rss'] / 1024:.1f} MiB"
    )


def memory(db: str, db_type: str) -> None:
    with open_database(db, db_type) as database:
        report_memory("list of bytes (before)", list(database.keys()))
    started = time.perf_counter()
    keys = read_keys(db, db_type)
    print(f"read_keys: {time.perf_counter() - started:.2f} s")
    report_memory("KeyStore (after)", keys)


def full_parse_scan(db: str, db_type: str, num_labels: int) -> None:
    """The check as it was: every record fetched (copied) and parsed in full."""
    with open_database(db, db_type) as database:
        for key in database.keys():
            try:
                label = parse_record(database.get(key)).label
            except RecordError:
                continue
            assert 0 <= label < num_labels


def labels(db: str, db_type: str, cold: bool) -> None:
    # Imported here: the memory figures are taken without the trainer's flag modules loaded.
    from resnet50_trainer.cli import build_parser, config_from_args

    # The run's Config, as the trainer builds it from its flags: the check reads its DB type, label
    # count and --test_epoch_size (the trainer's default: the whole DB).
    flags = ["--train_data", "null", "--use_cpu", "--db_type", db_type, "--num_labels", "1000"]
    config = config_from_args(build_parser().parse_args(flags), gpus_present=0)
    for name, scan in (
        ("full parse (before)", lambda: full_parse_scan(db, db_type, 1000)),
        ("label scan, whole DB", lambda: _check_test_labels(config, db, math.inf)),
        ("preflight's bounded scan", lambda: _check_test_labels(config, db, LABEL_SCAN_S)),
    ):
        if cold:
            evict(Path(db))
        started = time.perf_counter()
        scan()
        print(f"{name}: {time.perf_counter() - started:.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("memory", "labels"))
    parser.add_argument("db")
    parser.add_argument("--db_type", default=LMDB)
    parser.add_argument("--cold", action="store_true", help="labels: evict the DB from the cache")
    args = parser.parse_args()
    if args.what == "memory":
        memory(args.db, args.db_type)
    else:
        labels(args.db, args.db_type, args.cold)


if __name__ == "__main__":
    main()
