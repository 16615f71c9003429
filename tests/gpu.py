"""The one skip rule for the tests that need CUDA: every GPU test is marked `gpu` (so
`pytest -m gpu` collects them) and is skipped with a reason where the GPUs it needs are
missing. Use as decorators: `@needs_gpu`, `@needs_two_gpus`."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def _needs_gpus(count: int) -> Callable:
    skip = pytest.mark.skipif(GPUS < count, reason=f"needs {count} CUDA GPU(s); torch sees {GPUS}")
    return lambda test: pytest.mark.gpu(skip(test))


needs_gpu = _needs_gpus(1)
needs_two_gpus = _needs_gpus(2)
