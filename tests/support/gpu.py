"""The one skip rule for the tests that need CUDA: every GPU test is marked `gpu` (so
`pytest -m gpu` collects them) and is skipped with a reason where the GPUs it needs are
missing. Decorators `@needs_gpu`, `@needs_two_gpus`; for a parameter,
`pytest.param(..., marks=gpu_marks(1))`."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_marks(count: int) -> list[pytest.MarkDecorator]:
    reason = f"needs {count} CUDA GPU(s); torch sees {GPUS}"
    return [pytest.mark.gpu, pytest.mark.skipif(GPUS < count, reason=reason)]


def _needs_gpus(count: int) -> Callable:
    def marked(test: Callable) -> Callable:
        for mark in gpu_marks(count):
            test = mark(test)
        return test

    return marked


needs_gpu = _needs_gpus(1)
needs_two_gpus = _needs_gpus(2)
