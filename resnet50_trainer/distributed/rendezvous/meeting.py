"""The meeting: participants (shards, or ranks under srun/mpirun) find one TCPStore through a board.

Why stale entries of an earlier run with the same run id are never followed:
- participant 0 serves a fresh TCPStore on a free port, writes a random nonce into it, and only
  then publishes {host, port, nonce} on the board (with an expiry where the board has one);
- every other participant polls the board and accepts an entry only if a TCPStore answers at that
  address AND holds that nonce. An entry left by a crashed run names a dead port (refused), or a
  port since reused by someone else (no such nonce): it is ignored and polling goes on, so a
  participant that starts before participant 0 waits for the new entry instead of joining a dead
  run. The live store is the proof of freshness; no generation counter, and no trust in clocks,
  is needed;
- participant 0 refuses to start if the entry it finds is live: a run with this id is still going.
Then each participant checks in on the store ("arrived/<index>") and all wait until every one has,
so whoever gives up at the deadline can name the missing ones. The store and the process group
carry everything after that; participant 0 keeps the entry on the board (without expiry) until the
run ends, so a second run given the same id while this one trains is refused like one that comes
during the meeting, and withdraws it then (Meeting.close).
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch.distributed as dist

from resnet50_trainer.distributed.rendezvous import Board
from resnet50_trainer.errors import UserError

log = logging.getLogger(__name__)
NONCE_KEY = "rendezvous/nonce"
POLL_S = 0.2
PROBE_TIMEOUT_S = 3.0  # connecting to and validating a candidate store
EXPIRY_MARGIN_S = 60.0  # an entry outlives the meeting's deadline by this much, then Redis drops it


@dataclass
class Meeting:
    """The run's store; keep this object for the whole run (the served store dies with it)."""

    store: dist.TCPStore
    host: str
    port: int
    board: Board | None = None  # participant 0's: the entry that shows the run id in use
    entry: str | None = None

    def close(self) -> None:
        """The run is over: its id is free again (a crashed run's entry is stale, and ignored).
        A board out of reach by now (Redis down, the directory gone) costs the run nothing: the
        entry stays, and the next run with this id finds its store dead and replaces it."""
        if self.board is not None and self.entry is not None:
            try:
                self.board.withdraw(self.entry)
            except UserError as error:
                log.warning(
                    "The run's entry stays in %s, out of reach at the run's end (the next run "
                    "with this run id replaces it): %s",
                    self.board.where,
                    error,
                )
            self.entry = None


@dataclass(frozen=True)
class Seat:
    """Who is meeting: participant `index` of `count`, each a `noun` ("shard" or "rank")."""

    index: int
    count: int
    noun: str
    run_id: str


def meet(board: Board, seat: Seat, advertised_host: str, timeout_s: float) -> Meeting:
    deadline = time.monotonic() + timeout_s
    if seat.index == 0:
        meeting, entry = _host(board, seat, advertised_host, timeout_s)
    else:
        meeting, entry = _find(board, seat, deadline, timeout_s), None
    with _host_alive(seat, meeting, board.where) if seat.index else nullcontext():
        arrivals = meeting.store.add(f"arrived/{seat.index}", 1)
        if arrivals > 1:
            raise UserError(
                f"{seat.noun} {seat.index} of run {seat.run_id} arrived twice: give "
                f"each machine its own {seat.noun} id"
            )
        meeting.store.add("arrived", 1)
        _wait_for_all(meeting.store, seat, deadline, timeout_s, board.where)
    if entry is not None:  # kept while the run lasts, past the meeting's expiry
        board.publish(entry, ttl_s=None)
        meeting.board, meeting.entry = board, entry
    log.info(
        "All %d %ss of run %s met at %s:%d (via %s)",
        seat.count,
        seat.noun,
        seat.run_id,
        meeting.host,
        meeting.port,
        board.where,
    )
    return meeting


@contextmanager
def _host_alive(seat: Seat, meeting: Meeting, where: str) -> Iterator[None]:
    """The store lives in participant 0's process: once found, a failing store call means that
    participant is gone (killed, or its machine lost) while the others wait."""
    try:
        yield
    except (dist.DistError, RuntimeError) as error:  # DistError: torch's store errors
        raise UserError(
            f"{seat.noun} 0 of {seat.count}, which serves the meeting's store at "
            f"{meeting.host}:{meeting.port}, was lost during the meeting "
            f"({first_line(error)}; run_id {seat.run_id}, {where}): start the run "
            f"again, every {seat.noun} with the same --run_id"
        ) from None


def _host(board: Board, seat: Seat, host: str, timeout_s: float) -> tuple[Meeting, str]:
    previous = _read_entry(board, set())
    if previous and _probe(previous) is not None:
        raise UserError(
            f"run id {seat.run_id} is in use by a live run (its store answers at "
            f"{previous.host}:{previous.port}, found via {board.where}): use a "
            "new --run_id, or stop that run"
        )
    try:
        store = dist.TCPStore(
            host,
            0,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    except (dist.DistError, RuntimeError) as error:
        raise UserError(
            f"cannot serve the meeting's store at {host} ({first_line(error)}): "
            "name this machine's interface with --distributed_interfaces"
        ) from None
    nonce = secrets.token_hex(16)
    store.set(NONCE_KEY, nonce)
    entry = json.dumps({"host": host, "port": store.port, "nonce": nonce})
    board.publish(entry, timeout_s + EXPIRY_MARGIN_S)
    return Meeting(store, host, store.port), entry


def _find(board: Board, seat: Seat, deadline: float, timeout_s: float) -> Meeting:
    ignored: set[str] = set()  # entries already found stale or malformed, each named once
    while time.monotonic() < deadline:
        entry = _read_entry(board, ignored)
        if entry and entry.text not in ignored:
            store = _probe(entry)
            if store is not None:
                store.set_timeout(datetime.timedelta(seconds=timeout_s))
                return Meeting(store, entry.host, entry.port)
            ignored.add(entry.text)  # stale: left by an earlier run; wait for a new entry
            log.info(
                "Ignoring a stale rendezvous entry (%s:%d) in %s",
                entry.host,
                entry.port,
                board.where,
            )
        time.sleep(POLL_S)
    raise UserError(
        f"{seat.noun} 0 of {seat.count} did not arrive within {timeout_s:g} s "
        f"(run_id {seat.run_id}, {board.where}): start it with the same --run_id, "
        "or raise --first_iter_timeout"
    )


def _wait_for_all(
    store: dist.TCPStore, seat: Seat, deadline: float, timeout_s: float, where: str
) -> None:
    while store.add("arrived", 0) < seat.count:
        if time.monotonic() >= deadline:
            missing = [str(i) for i in range(seat.count) if not store.check([f"arrived/{i}"])]
            noun = seat.noun if len(missing) == 1 else f"{seat.noun}s"
            raise UserError(
                f"{noun} {', '.join(missing)} of {seat.count} did not arrive within "
                f"{timeout_s:g} s (run_id {seat.run_id}, {where}): start "
                f"{'it' if len(missing) == 1 else 'them'} with the same --run_id, "
                "or raise --first_iter_timeout"
            )
        time.sleep(POLL_S)


def _probe(entry: Entry) -> dist.TCPStore | None:
    """A client of the store the entry names, if that store is alive and holds the entry's nonce."""
    address = (entry.host, entry.port)
    try:  # a plain connect fails fast on a dead port, where TCPStore would retry until its timeout
        socket.create_connection(address, timeout=PROBE_TIMEOUT_S).close()
        store = dist.TCPStore(
            *address,
            is_master=False,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=PROBE_TIMEOUT_S),
        )
        if (
            store.check([NONCE_KEY])
            and store.get(NONCE_KEY).decode(errors="replace") == entry.nonce
        ):
            return store
    # Refused, or not a TCPStore; torch's DistError is a RuntimeError.
    except (OSError, RuntimeError):
        pass
    return None


@dataclass(frozen=True)
class Entry:
    """What participant 0 publishes: its store's address and the nonce held there."""

    host: str
    port: int
    nonce: str
    text: str  # as read from the board

    @classmethod
    def decode(cls, text: str) -> Entry:
        """Raises ValueError naming the bad part of an entry that is not one of ours."""
        try:
            value = json.loads(text)
        except ValueError as error:
            raise ValueError(f"not JSON: {error}") from None
        if not isinstance(value, dict) or not {"host", "port", "nonce"} <= value.keys():
            raise ValueError("not an object with host, port and nonce")
        host, port, nonce = value["host"], value["port"], value["nonce"]
        if not isinstance(host, str) or not host:
            raise ValueError(f"host {host!r} is not a host name")
        if type(port) is not int or not 0 < port < 65536:  # bool is an int: excluded by type()
            raise ValueError(f"port {port!r} is not a port number")
        if not isinstance(nonce, str):
            raise ValueError(f"nonce {nonce!r} is not a string")
        return cls(host, port, nonce, text)


def _read_entry(board: Board, ignored: set[str]) -> Entry | None:
    """The board's entry, or None while there is none or it is malformed (a partial or foreign
    file: participant 0 replaces it). A malformed entry is named once, in one line."""
    text = board.read()
    if not text:
        return None
    try:
        return Entry.decode(text)
    except ValueError as problem:
        if text not in ignored:
            ignored.add(text)
            log.warning("Ignoring a malformed rendezvous entry in %s (%s)", board.where, problem)
        return None


def first_line(error: BaseException) -> str:
    """A torch.distributed or Gloo error in one line: the first, without Gloo's source location
    ("[.../gloo/transport/tcp/pair.cc:545] ") and its boilerplate advice."""
    lines = str(error).strip().splitlines() or [type(error).__name__]
    line = re.sub(r"^\[[^\]]*\] ", "", lines[0])
    return line.split(" This is typically caused", 1)[0].rstrip(".")
