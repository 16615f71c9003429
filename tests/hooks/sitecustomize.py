"""Test-only fault injection, loaded at start-up by every Python process of a run whose PYTHONPATH
holds this directory (trainer_runs.pause_before_rename), spawned training processes included.

Each rename of a checkpoint's temporary file (`.tmp-<checkpoint>.pt-<random>.pt`, as
checkpoint.save_checkpoint names it) first sleeps RESNET50_TRAINER_TEST_PAUSE_BEFORE_RENAME
seconds: the writer is held between its fsync and its rename, where a test can kill it or start a
second run beside it. The trainer itself knows nothing of this."""

from __future__ import annotations

import os
import re
import time

PAUSE_ENV = "RESNET50_TRAINER_TEST_PAUSE_BEFORE_RENAME"
_CHECKPOINT_TEMPORARY = re.compile(r"\.tmp-.+\.pt-[a-z0-9_]{8}\.pt")
_pause_s = float(os.environ.get(PAUSE_ENV, 0))
_replace = os.replace


def _replace_after_a_pause(source, target, *args, **kwargs):
    if _CHECKPOINT_TEMPORARY.fullmatch(os.path.basename(os.fsdecode(source))):
        time.sleep(_pause_s)
    return _replace(source, target, *args, **kwargs)


if _pause_s:
    os.replace = _replace_after_a_pause
