"""sha256 of every file in a directory: what a reader must leave unchanged."""

from __future__ import annotations

import hashlib
import os


def _file_digests(path: str) -> dict:
    digests = {}
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as file:
            digests[name] = hashlib.sha256(file.read()).hexdigest()
    return digests
