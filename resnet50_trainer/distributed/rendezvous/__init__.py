"""Where the processes of a multi-machine run meet: a board (Redis or a shared directory) that
carries only the address of one TCPStore; the process group then runs on that store.

One interface, `Board`, for every backend (contract test: tests/system/test_rendezvous.py):
  where                   -> "redis 10.0.0.5:6379" / "directory /nfs/rdv": named in every error
  publish(entry, ttl_s)   -> replace the run's entry atomically (it expires after ttl_s where the
                             backend can expire it; ttl_s None: kept until withdrawn)
  read()                  -> the entry, or None while there is none
  withdraw(entry)         -> remove the entry if it is still this one
"""

from __future__ import annotations

from typing import Protocol


class Board(Protocol):
    where: str

    def publish(self, entry: str, ttl_s: float | None) -> None: ...

    def read(self) -> str | None: ...

    def withdraw(self, entry: str) -> None: ...


def open_board(
    run_id: str,
    redis_host: str | None,
    redis_port: int,
    redis_password: str | None,
    file_store_path: str,
) -> Board:
    """Redis when a host (or a redis:// URL) is given, else the shared directory."""
    if redis_host:
        from resnet50_trainer.distributed.rendezvous.redis_board import RedisBoard

        return RedisBoard(run_id, redis_host, redis_port, redis_password)
    from resnet50_trainer.distributed.rendezvous.file_board import FileBoard

    return FileBoard(run_id, file_store_path)
