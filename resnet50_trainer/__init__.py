"""ResNet-50 trainer for LMDB/LevelDB image databases, the heir of Caffe2's resnet50_trainer.py."""

from __future__ import annotations

import os

# Before torch is imported: its C++ store client logs every warning (a peer that went away) with a
# C++ stack trace, before the one line that names the lost peer. Errors stay; the user's value wins.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

__version__ = "0.1.0"
