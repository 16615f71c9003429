"""The split of records across processes: disjoint, complete, reshuffled per epoch, resumable;
in random order and in quasi-random order (runs of consecutive records, shuffled in windows)."""

from __future__ import annotations

import numpy as np
import pytest

from resnet50_trainer.data.cpu_decode import CpuDecode
from resnet50_trainer.data.order import (
    RecordOrder,
    ShardBatchSampler,
    StepReads,
    evaluation_batches,
    quasi_random_permutation,
)
from resnet50_trainer.data.settings import (
    QUASI_RANDOM_ORDER,
    RANDOM_ORDER,
    describe_order,
    resolve_read_order,
)
from tests.support.image_records import records_of

# (run_length, window_runs): random order, short runs in small windows, runs longer than the DB.
ORDERS = [(1, 1), (5, 3), (7, 2), (200, 4)]
RUN = pytest.mark.parametrize("run", ORDERS, ids=lambda run: f"run{run[0]}x{run[1]}")


def epoch_reads(num_records, seed, epoch, world, device_batch, steps, start_step=0, run=(1, 1)):
    """{rank: [record index, ...]} of one epoch."""
    order = RecordOrder(num_records, seed, *run)
    reads = {}
    for rank in range(world):
        sampler = ShardBatchSampler(order, steps, device_batch * world, device_batch, rank)
        sampler.set_epoch(epoch, start_step)
        reads[rank] = [index for step in sampler for _, index in step.items]
    return reads


@RUN
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_no_record_is_read_twice_in_an_epoch_across_processes(world, run):
    num_records, device_batch = 103, 4
    steps = num_records // (device_batch * world)
    for epoch in range(3):
        reads = epoch_reads(num_records, 7, epoch, world, device_batch, steps, run=run)
        everything = [index for indices in reads.values() for index in indices]
        assert len(everything) == steps * device_batch * world
        assert len(set(everything)) == len(everything)
        assert all(len(indices) == steps * device_batch for indices in reads.values())


@RUN
def test_order_changes_every_epoch_and_depends_on_the_seed(run):
    first = epoch_reads(64, 0, 0, 2, 4, 8, run=run)
    assert first != epoch_reads(64, 0, 1, 2, 4, 8, run=run)
    assert first != epoch_reads(64, 1, 0, 2, 4, 8, run=run)
    assert first == epoch_reads(64, 0, 0, 2, 4, 8, run=run)


@RUN
@pytest.mark.parametrize("world", [2, 3])
def test_global_order_does_not_depend_on_the_number_of_processes(world, run):
    steps, device_batch = 5, 4
    one = epoch_reads(120, 3, 2, 1, device_batch * world, steps, run=run)[0]
    many = epoch_reads(120, 3, 2, world, device_batch, steps, run=run)
    interleaved = [
        index
        for step in range(steps)
        for rank in range(world)
        for index in many[rank][step * device_batch : (step + 1) * device_batch]
    ]
    assert interleaved == one


@RUN
@pytest.mark.parametrize("world", [1, 2, 3])
def test_resuming_mid_epoch_reads_the_rest_of_the_epoch(world, run):
    full = epoch_reads(96, 0, 1, world, 4, 8, run=run)
    rest = epoch_reads(96, 0, 1, world, 4, 8, start_step=3, run=run)
    assert all(rest[rank] == full[rank][3 * 4 :] for rank in range(world))


@RUN
def test_epoch_size_larger_than_the_db_wraps_into_new_passes(run):
    reads = epoch_reads(10, 0, 0, 1, 5, 4, run=run)[0]  # 20 images from a 10-record DB
    assert sorted(reads[:10]) == list(range(10)) and sorted(reads[10:]) == list(range(10))


def test_random_order_is_the_permutation_every_version_drew():
    """Runs of 1: numpy's permutation seeded by (seed, pass), so a checkpoint of an earlier
    version resumes in the same order."""
    order = RecordOrder(50, 9)
    expected = np.random.default_rng([9, 1]).permutation(50)
    assert order.records_at(range(50, 100)) == expected.tolist()


@pytest.mark.parametrize("num_records", [1, 9, 10, 11, 1003])
@pytest.mark.parametrize("seed", range(4))
def test_a_quasi_random_window_holds_whole_runs_of_consecutive_records(num_records, seed):
    """The pass is windows of at most 3 whole runs of 10 (the DB's last run shorter, anywhere in
    the pass), each window's records shuffled: storage serves a run in one read; every record
    once."""
    permutation = quasi_random_permutation(num_records, 10, 3, np.random.default_rng(seed))
    assert sorted(permutation.tolist()) == list(range(num_records))

    def records_of(runs: set[int]) -> set[int]:
        return {index for run in runs for index in range(run * 10, min(num_records, run * 10 + 10))}

    start = 0
    while start < num_records:
        end, runs = start, set[int]()
        while end == start or (end < num_records and len(records_of(runs)) != end - start):
            runs.add(int(permutation[end]) // 10)  # until the runs seen are all read: a window
            end += 1
        assert len(runs) <= 3 and set(permutation[start:end].tolist()) == records_of(runs)
        start = end
    if num_records > 30:
        assert permutation[:30].tolist() != sorted(permutation[:30].tolist())


@pytest.mark.parametrize("seed", range(3))
def test_each_quasi_random_window_holds_each_label_of_a_db_in_label_order_in_its_share(seed):
    # 1,000 records, labels in runs of 100: 10 windows of 10 runs of 10, one run of each label.
    permutation = quasi_random_permutation(1000, 10, 10, np.random.default_rng(seed))
    for window in permutation.reshape(10, 100) // 100:
        assert np.bincount(window, minlength=10).tolist() == [10] * 10


GIB = 2**30


def test_auto_reads_in_runs_only_when_the_db_cannot_stay_in_memory():
    small = resolve_read_order("auto", 1000, 3 * GIB, 8 * GIB)
    assert small.shape == (1, 1) and describe_order(*small.shape) == RANDOM_ORDER
    assert "3.0 GiB is less than half this machine's 8 GiB" in small.why
    large = resolve_read_order("auto", 100_000, 5 * GIB, 8 * GIB)
    assert (
        describe_order(*large.shape).startswith(QUASI_RANDOM_ORDER)
        and "more than half this machine's 8 GiB" in large.why
    )
    # Every process reads one stream: a machine that can hold it follows one that cannot.
    elsewhere = resolve_read_order("auto", 100_000, 5 * GIB, 16 * GIB, larger_elsewhere=True)
    assert elsewhere.shape == large.shape and "another machine's memory" in elsewhere.why


def test_explicit_orders_win_and_runs_hold_about_512_kb():
    assert resolve_read_order("random", 1000, 500 * GIB, 8 * GIB).shape == (1, 1)
    quasi = resolve_read_order("quasi_random", 1_281_167, 140 * GIB, 512 * GIB)
    assert quasi.shape == (4, 1024)  # ImageNet: ~117 KB a record; 512 MB windows
    assert resolve_read_order("quasi_random", 400, 40_000, GIB).run_length == 400  # the whole DB
    huge_records = resolve_read_order("quasi_random", 10, 10 * 2**20, GIB)  # 1 MB a record
    assert huge_records.shape == (1, 1)  # random order's, as a checkpoint records it


def test_the_window_is_read_window_mb_and_one_too_large_for_memory_is_named():
    fits = resolve_read_order("quasi_random", 1_281_167, 140 * GIB, 16 * GIB, window_mb=64)
    assert fits.window_runs == 128 and "--read_window_mb" not in fits.why
    too_large = resolve_read_order("quasi_random", 1_281_167, 140 * GIB, 16 * GIB, window_mb=9000)
    assert too_large.window_runs == 18000
    assert "a window of 9000 MB cannot stay in half this machine's memory" in too_large.why
    assert "lower --read_window_mb" in too_large.why
    whole_db = resolve_read_order("quasi_random", 1000, 4 * GIB, 16 * GIB, window_mb=9000)
    assert "--read_window_mb" not in whole_db.why  # one window: read once whatever its size


@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_mid_epoch_resume_finishes_the_epoch_in_the_order_it_began_in(world):
    """The checkpoint's epoch goes on in its own order (here random) whatever this run's order
    (quasi-random): the epoch reads each record once; the next epoch reads in this run's."""
    began, now = RecordOrder(96, 0), RecordOrder(96, 0, 5, 3)
    full = epoch_reads(96, 0, 1, world, 4, 8)
    for rank in range(world):
        sampler = ShardBatchSampler(now, 8, 4 * world, 4, rank)
        assert sampler.finish_epoch_in(1, *began.shape)
        sampler.set_epoch(1, start_step=3)
        assert [index for step in sampler for _, index in step.items] == full[rank][3 * 4 :]
        assert sampler.epoch_order_shape == (1, 1)
        sampler.set_epoch(2)
        assert sampler.epoch_order_shape == (5, 3)
    assert not ShardBatchSampler(now, 8, 4, 4, 0).finish_epoch_in(1, 5, 3)


def test_each_step_carries_its_epochs_runs_and_the_next_steps_records():
    """The input processes outlive an epoch: each step tells them the run length of its own
    epoch's order (a resumed epoch's may differ from the next) and this process's next reads."""
    sampler = ShardBatchSampler(RecordOrder(96, 0, 5, 3), 8, 8, 4, rank=1)
    assert sampler.finish_epoch_in(1, 1, 1)
    for epoch, start_step, run_length in [(1, 3, 1), (2, 0, 5)]:
        sampler.set_epoch(epoch, start_step)
        steps = list(sampler)
        assert len(steps) == 8 - start_step
        assert {step.run_length for step in steps} == {run_length}
        following = [[index for _, index in step.items] for step in steps[1:]]
        assert [step.ahead for step in steps] == [*following, []]


def test_a_quasi_random_step_asks_storage_for_whole_runs_once(image_db):
    """The runs of this step's records and of the next step's, each asked of storage once (until
    the run length changes with the epoch's order)."""
    records = records_of(CpuDecode, image_db("runs", 30, 4))

    def asked(items, run_length, ahead):
        keys = records._runs_to_ask(StepReads(items, run_length, 3, ahead))
        return [records.keys.index(key) for key in keys]

    assert asked([(0, 12), (1, 3)], 5, [27]) == [*range(10, 15), *range(0, 5), *range(25, 30)]
    assert asked([(2, 13)], 5, [29, 0]) == []
    assert asked([(3, 13)], 4, []) == [*range(12, 16)]


def test_evaluation_covers_every_test_record_once():
    batches = [evaluation_batches(23, 4, rank, 3) for rank in range(3)]
    everything = [index for rank in batches for batch in rank for index in batch]
    assert sorted(everything) == list(range(23))
