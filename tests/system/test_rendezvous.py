"""The rendezvous contract every board (Redis, shared directory) passes, and each backend's
failures.

Participants run as threads of this process against a real redis-server or a temporary directory."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

import pytest
import redis
import torch.distributed as dist

from resnet50_trainer.distributed.rendezvous import open_board
from resnet50_trainer.distributed.rendezvous.meeting import Meeting, Seat, meet
from resnet50_trainer.errors import UserError
from tests.support.redis_server import free_port, redis_keys, redis_port, running_redis  # noqa: F401 (fixture)

HOST = "127.0.0.1"


@pytest.fixture(params=["redis", "files"])
def make_board(request, tmp_path):
    """make_board(run_id) -> a board of the backend under test; all share one server or
    directory."""
    if request.param == "redis":
        with running_redis() as port:
            yield lambda run_id: open_board(run_id, HOST, port, None, str(tmp_path))
    else:
        yield lambda run_id: open_board(run_id, None, 6379, None, str(tmp_path))


def meet_all(
    make_board, run_id: str, count: int, timeout_s: float = 20, indices=None, start_gap_s=0.3
):
    """Participants met in threads, index 0 last so the others start before it.
    Returns (index, Meeting or UserError) pairs; dict() of them where indices are unique."""
    results: list[tuple[int, Meeting | UserError]] = []

    def participant(index):
        try:
            results.append(
                (
                    index,
                    meet(make_board(run_id), Seat(index, count, "shard", run_id), HOST, timeout_s),
                )
            )
        except UserError as error:
            results.append((index, error))

    order = sorted(indices if indices is not None else range(count), reverse=True)
    threads = [threading.Thread(target=participant, args=(index,)) for index in order]
    for thread in threads:
        thread.start()
        time.sleep(start_gap_s)
    for thread in threads:
        thread.join(timeout=timeout_s + 15)
        assert not thread.is_alive(), "a participant hung past its deadline"
    return results


class TestBoardContract:
    def test_publish_read_withdraw(self, make_board):
        board = make_board("run-a")
        assert board.read() is None
        board.publish("one", ttl_s=60)
        board.publish("two", ttl_s=60)
        assert board.read() == "two"
        board.withdraw("one")  # not ours any more: stays
        assert board.read() == "two"
        board.withdraw("two")
        assert board.read() is None

    def test_run_ids_are_separate_namespaces(self, make_board):
        make_board("run-a").publish("a", ttl_s=60)
        make_board("run-b").publish("b", ttl_s=60)
        assert (make_board("run-a").read(), make_board("run-b").read()) == ("a", "b")

    def test_participants_started_before_participant_0_meet_on_one_store(self, make_board):
        results = meet_all(make_board, "run-a", count=3)
        ports = {meeting.port for _, meeting in results}
        assert len(ports) == 1, results
        # Kept while the run lasts: the id is in use until participant 0 closes the meeting.
        assert make_board("run-a").read() is not None
        with pytest.raises(UserError, match="run id run-a is in use by a live run"):
            meet(make_board("run-a"), Seat(0, 3, "shard", "run-a"), HOST, 5)
        dict(results)[0].close()
        assert make_board("run-a").read() is None

    def test_stale_entries_of_a_crashed_run_are_not_followed(self, make_board):
        board = make_board("run-a")
        dead_port = free_port()  # nothing listens there: the earlier run's store is gone
        board.publish(json.dumps({"host": HOST, "port": dead_port, "nonce": "old"}), ttl_s=600)
        results = dict(meet_all(make_board, "run-a", count=2, start_gap_s=1.0))
        assert results[0].port == results[1].port != dead_port

    def test_a_live_store_without_the_nonce_is_not_followed(self, make_board):
        unrelated = dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False)
        make_board("run-a").publish(
            json.dumps({"host": HOST, "port": unrelated.port, "nonce": "x"}), 600
        )
        results = dict(meet_all(make_board, "run-a", count=2, start_gap_s=1.0))
        assert results[0].port == results[1].port != unrelated.port

    def test_the_missing_shard_is_named_within_the_deadline(self, make_board):
        started = time.monotonic()
        results = dict(meet_all(make_board, "run-a", count=3, timeout_s=3, indices=[0, 2]))
        assert time.monotonic() - started < 3 + 5
        for index in (0, 2):
            assert "shard 1 of 3 did not arrive within 3 s (run_id run-a" in str(results[index])

    def test_a_missing_shard_0_is_named(self, make_board):
        results = dict(meet_all(make_board, "run-a", count=2, timeout_s=2, indices=[1]))
        assert "shard 0 of 2 did not arrive within 2 s (run_id run-a" in str(results[1])

    def test_shard_0_refuses_a_run_id_in_use_by_a_live_run(self, make_board):
        first = dict(meet_all(make_board, "run-a", count=1))[0]
        nonce = first.store.get("rendezvous/nonce").decode()
        make_board("run-a").publish(
            json.dumps({"host": HOST, "port": first.port, "nonce": nonce}), 60
        )
        with pytest.raises(UserError, match="run id run-a is in use by a live run"):
            meet(make_board("run-a"), Seat(0, 2, "shard", "run-a"), HOST, 5)

    def test_a_shard_id_given_twice_is_refused(self, make_board):
        results = meet_all(make_board, "run-a", count=3, timeout_s=3, indices=[0, 1, 1])
        assert any("shard 1 of run run-a arrived twice" in str(result) for _, result in results)


def test_redis_down_names_host_and_port():
    port = free_port()
    with pytest.raises(UserError, match=f"redis 127.0.0.1:{port}"):
        open_board("run-a", HOST, port, None, "/tmp")


def test_redis_password_and_database_from_a_url_and_never_shown():
    with running_redis("--requirepass", "s3cret-pw") as port:
        with pytest.raises(UserError) as refused:
            open_board("run-a", HOST, port, "wrong-pw", "/tmp")
        assert "refused the password" in str(refused.value) and "wrong-pw" not in str(refused.value)
        board = open_board("run-a", f"redis://:s3cret-pw@127.0.0.1:{port}/3", 6379, None, "/tmp")
        assert board.where == f"redis 127.0.0.1:{port}/3" and "s3cret" not in board.where
        board.publish("entry", ttl_s=30)
        database_3 = redis.Redis(port=port, password="s3cret-pw", db=3)
        assert database_3.get("resnet50_trainer:run-a:address") == b"entry"
        assert 0 < database_3.pttl("resnet50_trainer:run-a:address") <= 30_000  # expires


def test_a_directory_that_cannot_be_written_is_refused(tmp_path):
    read_only = tmp_path / "ro"
    read_only.mkdir(mode=0o500)
    if os.access(read_only, os.W_OK):  # root ignores modes: use a path that cannot exist instead
        read_only = tmp_path / "missing" / "dir"
    with pytest.raises(UserError, match=f"--file_store_path {read_only} cannot be written"):
        open_board("run-a", None, 6379, None, str(read_only))


def test_no_keys_are_left_on_redis_after_a_run(redis_port):  # noqa: F811 (fixture)
    make = lambda run_id: open_board(run_id, HOST, redis_port, None, "/tmp")  # noqa: E731
    results = dict(meet_all(make, "run-a", count=2))
    assert redis_keys(redis_port) != []  # the run id is in use while the run lasts, without expiry
    results[0].close()
    assert redis_keys(redis_port) == []


# A file at the board's path that is not an entry of ours, and how the warning names its bad part.
MALFORMED_ENTRIES = {
    "garbage": (b"garbage", "not JSON"),
    "not UTF-8": (b"\xff\xfe{\x00", "not JSON"),
    "a JSON list": (b"[1, 2]", "not an object with host, port and nonce"),
    "no nonce": (b'{"host": "127.0.0.1", "port": 5}', "not an object with host, port and nonce"),
    "port not a number": (
        b'{"host": "127.0.0.1", "port": "abc", "nonce": "x"}',
        "port 'abc' is not a port number",
    ),
    "port out of range": (
        b'{"host": "127.0.0.1", "port": 99999, "nonce": "x"}',
        "port 99999 is not a port number",
    ),
    "port true": (
        b'{"host": "127.0.0.1", "port": true, "nonce": "x"}',
        "port True is not a port number",
    ),
    "host not a string": (b'{"host": 5, "port": 80, "nonce": "x"}', "host 5 is not a host name"),
    "nonce not a string": (
        b'{"host": "127.0.0.1", "port": 80, "nonce": [7]}',
        "nonce [7] is not a string",
    ),
}


@pytest.mark.parametrize("name", MALFORMED_ENTRIES)
def test_a_malformed_entry_in_the_directory_is_named_in_one_line_and_replaced(
    tmp_path, caplog, name
):
    content, problem = MALFORMED_ENTRIES[name]
    (tmp_path / "resnet50_trainer.run-a.address").write_bytes(content)
    make = lambda run_id: open_board(run_id, None, 6379, None, str(tmp_path))  # noqa: E731
    with caplog.at_level(logging.INFO):
        results = dict(meet_all(make, "run-a", count=2, start_gap_s=1.0))
    assert results[0].port == results[1].port, results  # shard 0 replaced it; both met
    warnings = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert 1 <= len(warnings) <= 2, warnings  # once by each participant that read it
    for record in warnings:
        assert record.exc_info is None
        assert record.getMessage().startswith(
            f"Ignoring a malformed rendezvous entry in directory {tmp_path} ({problem}"
        )


def test_a_directory_where_the_entry_belongs_is_named(tmp_path):
    path = tmp_path / "resnet50_trainer.run-a.address"
    path.mkdir()
    make = lambda run_id: open_board(run_id, None, 6379, None, str(tmp_path))  # noqa: E731
    results = dict(meet_all(make, "run-a", count=2, timeout_s=3))
    for index in (0, 1):
        assert f"cannot read {path} (Is a directory): remove what is there" in str(results[index])
    assert os.listdir(tmp_path) == [path.name]  # nothing left behind


def test_a_value_on_redis_that_is_not_utf8_is_ignored(redis_port, caplog):  # noqa: F811 (fixture)
    make = lambda run_id: open_board(run_id, HOST, redis_port, None, "/tmp")  # noqa: E731
    redis.Redis(port=redis_port).set("resnet50_trainer:run-a:address", b"\xff\xfe")
    with caplog.at_level(logging.INFO):
        results = dict(meet_all(make, "run-a", count=2, start_gap_s=1.0))
    assert results[0].port == results[1].port, results
    assert (
        f"Ignoring a malformed rendezvous entry in redis {HOST}:{redis_port} (not JSON"
        in caplog.text
    )
