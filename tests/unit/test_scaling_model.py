"""benchmarks/scaling_model.py runs and its numbers are sane: efficiency in (0, 1], never lower on a
faster link, never higher with more GPUs, bf16 gradients never worse than fp32. No timing."""

from __future__ import annotations

import pytest

from benchmarks import scaling_model

CALIBRATION = scaling_model.CALIBRATION


@pytest.mark.parametrize("gpu", scaling_model.GPUS, ids=lambda gpu: gpu.name)
def test_efficiency_is_monotone_in_bandwidth_gpus_and_bytes(gpu):
    def efficiency(gpus: int, gbps: float, element_bytes: int) -> float:
        network = scaling_model.Network(gbps)
        return scaling_model.efficiency(gpu, gpus, network, element_bytes, CALIBRATION)

    links = (1, *scaling_model.LINKS_GBPS, 10_000)
    for element_bytes in scaling_model.GRADIENT_BYTES.values():
        for gpus in scaling_model.GPU_COUNTS:
            by_link = [efficiency(gpus, gbps, element_bytes) for gbps in links]
            assert all(0 < value <= 1 for value in by_link)
            assert by_link == sorted(by_link)  # a faster link never makes it worse
        for gbps in links:
            by_count = [efficiency(n, gbps, element_bytes) for n in (1, *scaling_model.GPU_COUNTS)]
            assert by_count[0] == pytest.approx(1.0)  # one GPU communicates nothing
            assert by_count == sorted(by_count, reverse=True)
    for gpus in scaling_model.GPU_COUNTS:
        assert efficiency(gpus, 25, 2) >= efficiency(gpus, 25, 4)


def test_ring_all_reduce_time_follows_the_formula():
    network = scaling_model.Network(gbps=100, efficiency=1.0, latency_s=0.0)
    size = 100e6  # bytes
    # 2 (N - 1) / N x S / B: 8 GPUs at 12.5 GB/s move 1.75 x 100 MB in 14 ms.
    assert network.all_reduce_seconds(size, 8) == pytest.approx(2 * 7 / 8 * size / 12.5e9)
    assert network.all_reduce_seconds(size, 1) == 0.0
