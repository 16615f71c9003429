"""The split of records across processes: disjoint, complete, reshuffled per epoch, resumable."""

from __future__ import annotations

import pytest

from resnet50_trainer.data.order import RecordOrder, ShardBatchSampler, evaluation_batches


def epoch_reads(num_records, seed, epoch, world, device_batch, steps, start_step=0):
    """{rank: [record index, ...]} of one epoch."""
    order = RecordOrder(num_records, seed)
    reads = {}
    for rank in range(world):
        sampler = ShardBatchSampler(order, steps, device_batch * world, device_batch, rank)
        sampler.set_epoch(epoch, start_step)
        reads[rank] = [index for batch in sampler for _, index in batch]
    return reads


@pytest.mark.parametrize("world", [1, 2, 4])
def test_no_record_is_read_twice_in_an_epoch_across_processes(world):
    num_records, device_batch = 103, 4
    steps = num_records // (device_batch * world)
    for epoch in range(3):
        reads = epoch_reads(num_records, 7, epoch, world, device_batch, steps)
        everything = [index for indices in reads.values() for index in indices]
        assert len(everything) == steps * device_batch * world
        assert len(set(everything)) == len(everything)
        assert all(len(indices) == steps * device_batch for indices in reads.values())


def test_order_changes_every_epoch_and_depends_on_the_seed():
    first = epoch_reads(64, 0, 0, 2, 4, 8)
    assert first != epoch_reads(64, 0, 1, 2, 4, 8)
    assert first != epoch_reads(64, 1, 0, 2, 4, 8)
    assert first == epoch_reads(64, 0, 0, 2, 4, 8)


def test_global_order_does_not_depend_on_the_number_of_processes():
    one = epoch_reads(64, 3, 2, 1, 8, 8)[0]
    two = epoch_reads(64, 3, 2, 2, 4, 8)
    interleaved = [
        index
        for step in range(8)
        for rank in (0, 1)
        for index in two[rank][step * 4 : (step + 1) * 4]
    ]
    assert interleaved == one


def test_resuming_mid_epoch_reads_the_rest_of_the_epoch():
    full = epoch_reads(64, 0, 1, 2, 4, 8)
    rest = epoch_reads(64, 0, 1, 2, 4, 8, start_step=3)
    assert all(rest[rank] == full[rank][3 * 4 :] for rank in (0, 1))


def test_epoch_size_larger_than_the_db_wraps_into_new_passes():
    reads = epoch_reads(10, 0, 0, 1, 5, 4)[0]  # 20 images from a 10-record DB
    assert sorted(reads[:10]) == list(range(10)) and sorted(reads[10:]) == list(range(10))


def test_evaluation_covers_every_test_record_once():
    batches = [evaluation_batches(23, 4, rank, 3) for rank in range(3)]
    everything = [index for rank in batches for batch in rank for index in batch]
    assert sorted(everything) == list(range(23))
