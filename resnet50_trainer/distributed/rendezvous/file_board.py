"""The rendezvous board in a shared (NFS) directory: one file per run, named for the run id.

It is written to a unique temporary name and renamed into place (atomic on POSIX file systems and
NFS), and read by plain polling: no inotify, no file locks, both unreliable over NFS. Opening a file
revalidates it on NFS (close-to-open consistency), so a reader sees a finished entry or none.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid

from resnet50_trainer.errors import UserError


class FileBoard:
    def __init__(self, run_id: str, directory: str):
        self.where = f"directory {directory}"
        self.path = os.path.join(directory, f"resnet50_trainer.{run_id}.address")
        try:
            with tempfile.TemporaryFile(dir=directory):
                pass
        except OSError as error:
            raise UserError(
                f"--file_store_path {directory} cannot be written ({error.strerror}): "
                "give a directory every shard can write, e.g. on NFS"
            ) from None

    def publish(self, entry: str, ttl_s: float | None) -> None:
        """No expiry in files (machines' clocks may disagree): readers prove an entry live
        instead."""
        staging = f"{self.path}.{uuid.uuid4().hex}.tmp"
        try:
            with open(staging, "w") as file:
                file.write(entry)
                file.flush()
                os.fsync(file.fileno())
            os.replace(staging, self.path)
        except OSError as error:
            # What this run wrote, never what is there; on a read-only or vanished directory
            # the removal fails too, and the write's reason is the one to report.
            with contextlib.suppress(OSError):
                os.remove(staging)
            raise UserError(
                f"cannot write {self.path} ({error.strerror}): remove what is there "
                "or check --file_store_path"
            ) from None

    def read(self) -> str | None:
        try:
            # Not UTF-8: a foreign file; the meeting ignores what does not decode as an entry.
            with open(self.path, errors="replace") as file:
                return file.read()
        except FileNotFoundError:
            return None
        except OSError as error:
            raise UserError(
                f"cannot read {self.path} ({error.strerror}): remove what is there "
                "or check --file_store_path"
            ) from None

    def withdraw(self, entry: str) -> None:
        if self.read() == entry:
            # A leftover entry is harmless (its store dies with the run, so readers ignore it):
            # a directory that refuses the removal does not stop a run that has met.
            with contextlib.suppress(OSError):
                os.remove(self.path)
