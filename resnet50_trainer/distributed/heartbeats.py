"""Which peer a failed wait lost: every training process beats on the run's store, and a process
whose wait on its peers failed names those whose beat stopped.

Gloo names at most an address (a reset connection) and nothing on a timeout, which is all a machine
whose link went down leaves behind; the store knows more. Each process adds 1 to
"heartbeat/<rank>" every HEARTBEAT_S, from a thread and a connection of its own (the training
thread may be blocked in a collective, and a connection to a vanished machine may block for
minutes). A process that noticed the loss says so ("stopping/<rank>") before it reads the beats
twice, ROLL_CALL_S apart: the ranks whose beat did not move and that did not say so themselves are
the lost ones (a survivor that left first is not named). The store lives on the machine of rank 0
(its launching process, or the launcher's agent, serves it): a store that does not answer within
STORE_ANSWER_S means that machine was lost or this one was cut off from it. Either way the answer
comes within ROLL_CALL_S + 2 x STORE_ANSWER_S, never later.
"""

from __future__ import annotations

import datetime
import socket
import threading
import time

import torch.distributed as dist

HEARTBEAT_S = 1.0
ROLL_CALL_S = 3.0  # three beats: a live process on a loaded machine still shows one
STORE_ANSWER_S = 5.0
_BEAT = "heartbeat/{}"
_STOPPING = "stopping/{}"
_heartbeat: Heartbeat | None = None  # this process's, from joining the group to leaving it


def start_heartbeat(address: tuple[str, int], rank: int, world_size: int, per_machine: int):
    """Beat on the run's store at `address` (a run of one process has no peer to lose)."""
    global _heartbeat
    if world_size > 1:
        _heartbeat = Heartbeat(*address, rank, world_size, per_machine)


def stop_heartbeat() -> None:
    global _heartbeat
    if _heartbeat is not None:
        _heartbeat.stop()
        _heartbeat = None


def who_was_lost() -> str:
    """The subject of "... during <the wait>": see Heartbeat.who_was_lost."""
    return _heartbeat.who_was_lost() if _heartbeat else "a peer was lost or stopped answering"


def ranks_named(ranks: list[int], per_machine: int) -> str:
    """ "rank 3 (shard 1)", "ranks 2, 3 (shard 1)": shard = rank // processes per machine."""
    shards = sorted({rank // per_machine for rank in ranks})
    return (
        f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
        f"(shard{'s' if len(shards) > 1 else ''} {', '.join(map(str, shards))})"
    )


class Heartbeat:
    """This process's beat on the store at host:port, from now until stop()."""

    def __init__(self, host: str, port: int, rank: int, world_size: int, per_machine: int):
        self.host, self.port = host, port
        self.rank, self.world_size, self.per_machine = rank, world_size, per_machine
        self._stopped = threading.Event()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()

    def _connect(self) -> dist.TCPStore:
        # A plain connect first: it fails in silence where TCPStore would log an error with a
        # C++ stack trace on stderr, beside the run's one line.
        socket.create_connection((self.host, self.port), timeout=STORE_ANSWER_S).close()
        return dist.TCPStore(
            self.host,
            self.port,
            is_master=False,
            timeout=datetime.timedelta(seconds=STORE_ANSWER_S),
        )

    def _beat(self) -> None:
        store = None
        while not self._stopped.is_set():
            try:
                store = store or self._connect()
                store.add(_BEAT.format(self.rank), 1)
            except (RuntimeError, OSError):  # torch's DistError is a RuntimeError
                store = None  # try again on a new connection at the next beat
            self._stopped.wait(HEARTBEAT_S)

    def who_was_lost(self) -> str:
        """Who this process lost, as the subject of "... during <the wait>": the ranks whose beat
        stopped, rank 0's machine when the store does not answer, else "a peer"."""
        verdict: list[list[int]] = []
        roll_call = threading.Thread(target=self._roll_call, args=(verdict,), daemon=True)
        roll_call.start()
        roll_call.join(ROLL_CALL_S + 2 * STORE_ANSWER_S)
        if not verdict:
            return (
                f"the machine of {ranks_named([0], self.per_machine)}, which serves the run's "
                f"store at {self.host}:{self.port}, was lost or cut off from this one"
            )
        silent = verdict[0]
        if not silent:
            return "a peer was lost or stopped answering"
        verb = "were" if len(silent) > 1 else "was"
        return (
            f"{ranks_named(silent, self.per_machine)} of {self.world_size} {verb} lost "
            "or stopped answering"
        )

    def _roll_call(self, verdict: list[list[int]]) -> None:
        """Appends the silent ranks to `verdict`; nothing where the store does not answer."""
        try:
            verdict.append(self._silent_ranks())
        except (RuntimeError, OSError):
            pass

    def _silent_ranks(self) -> list[int]:
        store = self._connect()
        store.set(_STOPPING.format(self.rank), "1")
        others = [rank for rank in range(self.world_size) if rank != self.rank]
        before = [store.add(_BEAT.format(rank), 0) for rank in others]
        time.sleep(ROLL_CALL_S)
        after = [store.add(_BEAT.format(rank), 0) for rank in others]
        return [
            rank
            for rank, old, new in zip(others, before, after)
            if old == new and not store.check([_STOPPING.format(rank)])
        ]
