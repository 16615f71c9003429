"""LMDB and LevelDB readers and writers, on real databases in temporary directories."""

from __future__ import annotations

import ctypes
import mmap
import os
import time

import numpy as np
import plyvel
import pytest

from resnet50_trainer.data.formats.databases import READERS, open_database
from resnet50_trainer.data.formats.db_types import DB_TYPES
from resnet50_trainer.data.formats.leveldb_reader import LevelDbDatabase
from resnet50_trainer.data.formats.lmdb_prefetch import _merged
from resnet50_trainer.data.formats.lmdb_reader import LmdbDatabase
from resnet50_trainer.data.formats.writers import WRITERS, open_writer
from resnet50_trainer.errors import UserError
from tests.support.dbfactory import cut_short, write_db
from tests.support.file_digests import _file_digests

RECORDS = [(b"%03d" % index, b"value-%d" % index) for index in (5, 1, 3, 0, 2, 4)]


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_reader_gives_sorted_keys_and_values(tmp_path, db_type):
    path = write_db(str(tmp_path / "db"), db_type, RECORDS)
    with open_database(path, db_type) as database:
        assert database.keys() == sorted(key for key, _ in RECORDS)
        assert len(database) == 6
        assert database.get(b"003") == b"value-3"
        with pytest.raises(UserError, match="not in database"):
            database.get(b"missing")


def test_wrong_paths_and_types_are_user_errors_with_the_fix(tmp_path):
    lmdb_path = write_db(str(tmp_path / "a_lmdb"), "lmdb", RECORDS)
    leveldb_path = write_db(str(tmp_path / "a_leveldb"), "leveldb", RECORDS)
    (tmp_path / "plain").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "data.mdb").write_bytes(b"\x00" * 8192)
    cases = [
        (
            lmdb_path,
            "leveldb",
            "is an LMDB database but --db_type leveldb was given; pass --db_type lmdb",
        ),
        (
            leveldb_path,
            "lmdb",
            "is a LevelDB database but --db_type lmdb was given; pass --db_type leveldb",
        ),
        (str(tmp_path / "nowhere"), "lmdb", "does not exist"),
        (str(tmp_path / "plain"), "lmdb", "holds neither an LMDB"),
        (str(tmp_path / "file"), "lmdb", "is a file, not a directory"),
        (lmdb_path, "rocksdb", "unknown database type"),
        (str(tmp_path / "broken"), "lmdb", "cannot open LMDB"),
    ]
    for path, db_type, message in cases:
        with pytest.raises(UserError, match=message):
            open_database(path, db_type)


def test_an_lmdb_cut_short_is_refused_before_its_pages_are_read(image_db):
    """A page past data.mdb's end would kill the process (SIGBUS): the meta page says how long
    the file must be, and a shorter one is refused at open, naming the file and the fix."""
    path = cut_short(image_db("db", 40, 4))
    with pytest.raises(UserError) as refused:
        open_database(path, "lmdb", allow_empty=True)
    assert str(refused.value).startswith(f"LMDB {path} is incomplete: its data.mdb is ")
    assert "copy it again from its source" in str(refused.value)


@pytest.mark.parametrize("read", ["keys", "get", "view", "items", "prefetch"])
def test_an_lmdb_cut_short_while_open_is_refused_at_the_next_read(image_db, read):
    """data.mdb truncated under an open reader (a copy over it restarting): each read checks its
    length first."""
    path = image_db("db", 40, 4)
    with open_database(path, "lmdb") as database:
        key = database.keys()[-1]
        database._keys = None  # listed again below
        if read == "items":
            records = database.items()
            next(records)
        cut_short(path)
        reads = {
            "keys": database.keys,
            "get": lambda: database.get(key),
            "view": lambda: database.view(key),
            "items": lambda: list(records),
            "prefetch": lambda: database.prefetch([key]),
        }
        with pytest.raises(UserError, match="is incomplete: its data.mdb is"):
            reads[read]()


@pytest.mark.parametrize("damage", ["its kind changed", "zeroed"])
def test_a_damaged_lmdb_page_is_named_in_one_line_before_lmdb_reads_it(tmp_path, damage):
    """LMDB checks its pages with assertions: iterating onto a zeroed leaf page aborted the
    process (SIGABRT, "Assertion 'IS_LEAF(mp)' failed in mdb_cursor_next()"). The B-tree's pages
    are checked when the DB is opened, and the first damaged one named."""
    records = [(b"%05d" % index, bytes(1000)) for index in range(300)]  # ~100 leaf pages
    path = write_db(str(tmp_path / "db"), "lmdb", records)
    with open(os.path.join(path, "data.mdb"), "r+b") as data:
        pages = data.read()
        page_size = 4096
        last_leaf = max(at for at in range(0, len(pages), page_size) if pages[at + 10] == _LEAF)
        if damage == "zeroed":
            data.seek(last_leaf)
            data.write(bytes(page_size))
        else:
            data.seek(last_leaf + 10)
            data.write(bytes([_OVERFLOW]))  # its flags: a leaf page no longer
    with pytest.raises(UserError) as refused:
        open_database(path, "lmdb").keys()
    assert str(refused.value) == (
        f"LMDB {path} is damaged: page {last_leaf // page_size} of its B-tree does not read as "
        "one (zeroed or overwritten); copy it again from its source, or build it again with "
        "`resnet50-db create`"
    )


_LEAF, _OVERFLOW = 0x02, 0x04  # MDB_page.mp_flags, at byte 10 of a page


def test_a_damaged_leveldb_is_named_in_one_line(tmp_path):
    """A table file cut short: plyvel's error in one line naming the DB's file, not the link in
    the reader's snapshot."""
    path = write_db(
        str(tmp_path / "db"), "leveldb", [(b"%05d" % i, bytes(3000)) for i in range(300)]
    )
    compacted = plyvel.DB(path)  # the records in a table file
    compacted.compact_range()
    compacted.close()
    (table,) = [name for name in os.listdir(path) if name.endswith(".ldb")]
    os.truncate(os.path.join(path, table), os.path.getsize(os.path.join(path, table)) // 3)
    with pytest.raises(UserError) as refused:
        open_database(path, "leveldb")
    message = str(refused.value)
    assert message.startswith(f"cannot read LevelDB {path} (") and "\n" not in message
    assert f"{path}/{table}" in message and "copy it again from its source" in message


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_empty_database_is_refused_unless_allowed(tmp_path, db_type):
    path = write_db(str(tmp_path / "db"), db_type, [])
    with pytest.raises(UserError, match="holds no records"):
        open_database(path, db_type)
    with open_database(path, db_type, allow_empty=True) as database:
        assert len(database) == 0


def test_leveldb_reads_tables_through_links_and_removes_its_snapshot(tmp_path):
    path = str(tmp_path / "db")
    with open_writer(path, "leveldb") as writer:
        for key, value in RECORDS:
            writer.put(key, value)
    tables = sorted(name for name in os.listdir(path) if name.endswith(".ldb"))
    database = open_database(path, "leveldb")
    assert isinstance(database, LevelDbDatabase)
    snapshot = database._snapshot
    assert tables and all(
        os.readlink(os.path.join(snapshot, name)) == os.path.join(path, name) for name in tables
    )
    assert database.get(b"002") == b"value-2"
    database.close()
    database.close()
    assert not os.path.exists(snapshot)


def test_lmdb_reader_writes_no_lock_file(tmp_path):
    path = str(tmp_path / "db")
    with open_writer(path, "lmdb") as writer:
        writer.put(b"k", b"v")
    with open_database(path, "lmdb") as database:
        assert database.get(b"k") == b"v"
    assert os.listdir(path) == ["data.mdb"]


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_lock_file_that_is_no_file_is_no_writer(tmp_path, kind):
    """Whether another process has the DB open is asked of lock.mdb: a FIFO in its place must not
    block the reader (no writer at its other end), nor anything else stop it."""
    path = write_db(str(tmp_path / "db"), "lmdb", RECORDS)
    lock_file = os.path.join(path, "lock.mdb")
    os.remove(lock_file)
    if kind == "fifo":
        os.mkfifo(lock_file)
    else:
        os.mkdir(lock_file)
    with open_database(path, "lmdb") as database:
        assert database.get(b"003") == b"value-3"


def test_lmdb_writer_grows_its_map_as_needed(tmp_path):
    path = str(tmp_path / "db")
    chunk = os.urandom(1 << 20)
    with open_writer(path, "lmdb", batch_size=8) as writer:
        for index in range(40):  # 40 MiB, beyond the 16 MiB the map starts with
            writer.put(b"%02d" % index, chunk)
    with open_database(path, "lmdb") as database:
        assert len(database) == 40 and database.get(b"39") == chunk


def test_leveldb_writer_leaves_a_compacted_database_without_info_logs(tmp_path):
    path = str(tmp_path / "db")
    with open_writer(path, "leveldb", batch_size=7) as writer:
        for key, value in RECORDS:
            writer.put(key, value)
    names = os.listdir(path)
    assert "LOG" not in names and "LOG.old" not in names
    assert all(
        os.path.getsize(os.path.join(path, name)) == 0 for name in names if name.endswith(".log")
    )
    with open_database(path, "leveldb") as database:
        assert [database.get(key) for key in database.keys()] == [
            value for _, value in sorted(RECORDS)
        ]


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_writer_output_is_byte_reproducible(tmp_path, db_type):
    digests = []
    for run in range(2):
        path = str(tmp_path / f"db{run}")
        with open_writer(path, db_type, batch_size=2) as writer:
            for key, value in RECORDS:
                writer.put(key, value)
        digests.append(_file_digests(path))
        with open_database(path, db_type) as database:  # keys came unsorted, across batches
            assert [(key, database.get(key)) for key in database.keys()] == sorted(RECORDS)
    assert digests[0] == digests[1]


def test_writer_refuses_an_existing_path(tmp_path):
    with pytest.raises(UserError, match="already exists"):
        open_writer(str(tmp_path), "lmdb")


@pytest.mark.parametrize("db_type", DB_TYPES)
def test_one_db_opened_twice_in_a_process_reads_from_both(image_db, db_type):
    """--test_data may be --train_data: LMDB refuses a second open of an environment in one
    process, so the readers share it; closing one leaves the other reading."""
    path = image_db("db", 4, 2, db_type=db_type)
    first, second = open_database(path, db_type), open_database(path, db_type)
    keys = first.keys()
    assert second.keys() == keys
    first.close()
    assert second.get(keys[0]) and second.get(keys[-1])
    second.close()
    with open_database(path, db_type) as again:  # and it opens afresh after both closed
        assert again.keys() == keys


def resident_pages(path: str) -> list[bool]:
    """Which of the file's 4 KB pages are in the page cache (mincore over a map of it)."""
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        pages = (len(mapped) + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vector = (ctypes.c_ubyte * pages)()
        view = np.frombuffer(mapped, dtype=np.uint8)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        assert libc.mincore(ctypes.c_void_p(view.ctypes.data), len(mapped), vector) == 0
        del view  # before the map closes
    return [bool(page & 1) for page in vector]


def write_values(path: str, values: dict[bytes, bytes]) -> str:
    with open_writer(path, "lmdb") as writer:
        for key, value in values.items():
            writer.put(key, value)
    return path


def test_lmdb_prefetch_brings_the_records_pages_into_the_page_cache_without_reading_them(
    tmp_path,
):
    """After the DB's pages are dropped from the cache, prefetching some records brings in their
    values' pages (the kernel reads them, a request a record), and the others stay out."""
    values = {f"{index:04d}".encode(): os.urandom(40_000) for index in range(64)}
    path = write_values(str(tmp_path / "db"), values)
    data = os.path.join(path, "data.mdb")
    descriptor = os.open(data, os.O_RDONLY)
    os.fsync(descriptor)  # written pages must be clean for the kernel to drop them
    os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(descriptor)
    if sum(resident_pages(data)) > len(resident_pages(data)) // 10:
        pytest.skip("this filesystem keeps the file's pages cached whatever it is advised")
    wanted = [f"{index:04d}".encode() for index in range(1, 64, 8)]  # 8 records of 10 pages
    with open_database(path, "lmdb") as database:
        database.prefetch(wanted)
        resident = 0
        for _ in range(300):  # the reads are the kernel's, asynchronous
            resident = sum(resident_pages(data))
            if resident >= 8 * 9:
                break
            time.sleep(0.01)
        assert 8 * 9 <= resident < len(resident_pages(data)) // 2
        assert all(bytes(database.view(key)) == values[key] for key in wanted)


@pytest.mark.parametrize("size", [10, 1000, 5000, 100_000])
def test_the_values_are_located_where_lmdb_keeps_them(tmp_path, size):
    """Small values live in their leaf page, large ones on overflow pages: each located span is
    where get() finds the value, whether the key was positioned on or read from its leaf page
    (500 keys fill several leaf pages); absent keys are left out."""
    values = {f"k{index:03d}".encode(): os.urandom(size) for index in range(500)}
    path = write_values(str(tmp_path / "db"), values)
    with open_database(path, "lmdb") as database:
        database.prefetch([b"k000"])
        assert isinstance(database, LmdbDatabase)
        locator = database._locator
        assert locator is not None
        asked = [b"k499", b"absent", *values, b"k0005", b"k250"]  # out of order, repeated
        spans = locator.spans(asked)
        assert len(spans) == len(values)
        with open(os.path.join(path, "data.mdb"), "rb") as file:
            for (start, length), value in zip(spans, values.values()):
                file.seek(start)
                assert length == size and file.read(size) == value
        assert locator.spans([b"absent", b"k5000"]) == []


def test_neighbouring_spans_are_one_request():
    assert _merged([(8192, 100), (0, 4096), (100_000, 10), (12_000, 50)]) == [
        (0, 12_050),
        (100_000, 10),
    ]


def test_every_db_type_has_a_reader_and_a_writer():
    assert tuple(READERS) == tuple(WRITERS) == DB_TYPES
