"""This machine's GPU utilisation and memory, sampled by NVML in a background thread.

The training step never waits for it: the thread samples at most once a second and the progress
bar reads the last sample. Without NVML (no GPU, no driver, CPU runs) it is off and costs nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

log = logging.getLogger(__name__)
SAMPLE_INTERVAL_S = 1.0
GIB = 1 << 30


class GpuMonitor:
    def __init__(self, gpu_indices: Sequence[int], interval_s: float = SAMPLE_INTERVAL_S):
        self._handles = []
        self._interval_s = interval_s
        self._summary: str | None = None
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        if gpu_indices:
            self._handles = _nvml_handles(gpu_indices)

    @property
    def enabled(self) -> bool:
        return bool(self._handles)

    def start(self) -> GpuMonitor:
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="gpu-monitor", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self) -> str | None:
        """e.g. 'util 97% 95%, mem 61.0/79.6 GiB' over this machine's GPUs, or None when off."""
        return self._summary

    def _run(self) -> None:
        import pynvml

        while not self._stopped.is_set():
            try:
                utilisation = [pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles]
                memory = [pynvml.nvmlDeviceGetMemoryInfo(h) for h in self._handles]
            except pynvml.NVMLError as error:  # a GPU fell off the bus or the driver went away
                log.warning("GPU monitoring stopped: %s", error)
                return
            used = sum(m.used for m in memory) / GIB
            total = sum(m.total for m in memory) / GIB
            self._summary = (
                f"util {' '.join(f'{u}%' for u in utilisation)}, mem {used:.1f}/{total:.1f} GiB"
            )
            self._stopped.wait(self._interval_s)


def _nvml_handles(gpu_indices: Sequence[int]) -> list:
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [_nvml_handle(pynvml, index) for index in gpu_indices]
    except Exception as error:  # ImportError or any NVMLError: monitoring is optional
        log.info("GPU utilisation not shown (NVML unavailable: %s)", error)
        return []
    if any(_is_mig(pynvml, handle) for handle in handles):
        log.warning(
            "GPU utilisation not shown: the GPUs are MIG instances (or run with MIG on), for "
            "which NVML reports no utilisation; nvidia-smi shows their memory"
        )
        return []
    return handles


def _nvml_handle(pynvml, cuda_index: int):
    """CUDA numbers the GPUs that CUDA_VISIBLE_DEVICES lets it see; NVML numbers all of them in
    PCI order. The device's UUID is the same in both (a MIG instance's is named MIG-...)."""
    import torch

    uuid = getattr(torch.cuda.get_device_properties(cuda_index), "uuid", None)
    if uuid is None:  # torch too old to say: the numbering agrees without CUDA_VISIBLE_DEVICES
        return pynvml.nvmlDeviceGetHandleByIndex(cuda_index)
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
    except pynvml.NVMLError:
        return pynvml.nvmlDeviceGetHandleByUUID(f"MIG-{uuid}")


def _is_mig(pynvml, handle) -> bool:
    try:
        if pynvml.nvmlDeviceIsMigDeviceHandle(handle):
            return True
        current, _ = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:  # NOT_SUPPORTED: a GPU without MIG
        return False
    return current == pynvml.NVML_DEVICE_MIG_ENABLE
