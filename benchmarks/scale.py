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
(benchmarks/startup.py: `python -m benchmarks run --only first_step preflight`), and so are the
keys' memory and the whole-DB label scan, cold and cached (`--only scale`, on startup's DBs).

Usage: python -m benchmarks.scale memory|labels DB [--db_type lmdb] [--cold]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.registry import LOWER, Context, Figure, benchmark
from benchmarks.startup import cold_reads_unavailable, evict, make_scale_dbs, scale_db
from benchmarks.trees import Tree
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


def key_memories(db: str, db_type: str) -> dict:
    """A forked child's memory (growth reading every key, totals after; KiB) with the keys as a
    list of bytes (`list`, as before) and as the trainer's KeyStore (`store`), and the seconds
    read_keys takes (`read_keys_s`)."""
    with open_database(db, db_type) as database:
        as_list = child_memory(list(database.keys()))
    started = time.perf_counter()
    keys = read_keys(db, db_type)
    seconds = time.perf_counter() - started
    as_store = child_memory(keys)
    return {"list": as_list, "store": as_store, "count": len(keys), "read_keys_s": seconds}


def memory(db: str, db_type: str) -> None:
    measured = key_memories(db, db_type)
    for name, which in (("list of bytes (before)", "list"), ("KeyStore (after)", "store")):
        growth, totals = measured[which]
        print(
            f"{name}: {measured['count']} keys; the child grew by USS "
            f"{growth['uss'] / 1024:.1f} MiB, PSS {growth['pss'] / 1024:.1f} MiB, RSS "
            f"{growth['rss'] / 1024:.1f} MiB reading every key; its totals: USS "
            f"{totals['uss'] / 1024:.1f} MiB, PSS {totals['pss'] / 1024:.1f} MiB, RSS "
            f"{totals['rss'] / 1024:.1f} MiB"
        )
    print(f"read_keys: {measured['read_keys_s']:.2f} s")


def memory_figures(db: str) -> dict[str, float]:
    """The declared figures of the keys (in a tree's process, before the flags' modules load)."""
    measured = key_memories(db, LMDB)
    return {
        "keys_list_child_uss_mib": measured["list"][0]["uss"] / 1024,
        "keys_store_child_uss_mib": measured["store"][0]["uss"] / 1024,
        "read_keys_1m_s": measured["read_keys_s"],
    }


def full_parse_scan(db: str, db_type: str, num_labels: int) -> None:
    """The check as it was: every record fetched (copied) and parsed in full."""
    with open_database(db, db_type) as database:
        for key in database.keys():
            try:
                label = parse_record(database.get(key)).label
            except RecordError:
                continue
            assert 0 <= label < num_labels


WHOLE_SCAN = "label scan, whole DB"


def scans(db: str, db_type: str) -> dict[str, Callable[[], object]]:
    """The full parse (before), the label scan over the whole DB, and preflight's bounded one."""
    # Imported here: the memory figures are taken without the trainer's flag modules loaded.
    from resnet50_trainer.cli import build_parser, config_from_args

    # The run's Config, as the trainer builds it from its flags: the check reads its DB type, label
    # count and --test_epoch_size (the trainer's default: the whole DB).
    flags = ["--train_data", "null", "--use_cpu", "--db_type", db_type, "--num_labels", "1000"]
    config = config_from_args(build_parser().parse_args(flags), gpus_present=0)
    return {
        "full parse (before)": lambda: full_parse_scan(db, db_type, 1000),
        WHOLE_SCAN: lambda: _check_test_labels(config, db, math.inf),
        "preflight's bounded scan": lambda: _check_test_labels(config, db, LABEL_SCAN_S),
    }


def timed(scan: Callable[[], object], db: str, cold: bool) -> float:
    """Seconds of `scan`; `cold`: the DB evicted from the page cache first."""
    if cold:
        evict(Path(db))
    started = time.perf_counter()
    scan()
    return time.perf_counter() - started


def labels(db: str, db_type: str, cold: bool) -> None:
    for name, scan in scans(db, db_type).items():
        print(f"{name}: {timed(scan, db, cold):.2f} s")


def label_figures(db: str) -> dict[str, float]:
    """The whole-DB label scan, cold then from the page cache (in a tree's process)."""
    scan = scans(db, LMDB)[WHOLE_SCAN]
    cold = timed(scan, db, cold=True)
    return {"label_scan_cold_50k_s": cold, "label_scan_cached_50k_s": timed(scan, db, cold=False)}


def _seconds(name: str, doc: str) -> Figure:
    return Figure(name, "s", LOWER, None, 0.2, doc, floor=0.2)


@benchmark(
    "scale",
    "ImageNet-scale keys and labels",
    (
        Figure(
            "keys_list_child_uss_mib",
            "MiB",
            LOWER,
            None,
            0.1,
            "a forked input process's private memory (USS) grown reading every key of the "
            "1,281,167-record LMDB, the keys held as a list of bytes objects (as before)",
            floor=1.0,
        ),
        Figure(
            "keys_store_child_uss_mib",
            "MiB",
            LOWER,
            None,
            0.5,
            "the same, the keys held as the trainer's KeyStore",
            floor=1.0,
        ),
        _seconds("read_keys_1m_s", "the trainer's read of the 1,281,167 keys (read_keys)"),
        _seconds(
            "label_scan_cold_50k_s",
            "the test labels read from the wire format over the whole 50,000-record, 5.8 GB "
            "LMDB, evicted from the page cache first",
        ),
        _seconds("label_scan_cached_50k_s", "the same scan, the DB in the page cache"),
    ),
    prepare=make_scale_dbs,
    unavailable=cold_reads_unavailable,
    rounds=(1, 3),
    order=15,
)
def measure_scale(context: Context, tree: Tree) -> dict[str, float]:
    keys = tree.call("benchmarks.scale:memory_figures", db=str(scale_db(context, "train_1m")))
    scanned = tree.call("benchmarks.scale:label_figures", db=str(scale_db(context, "test_50k")))
    return {**keys, **scanned}


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
