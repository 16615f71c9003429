"""A run of one process trains its model without DistributedDataParallel (nothing to all-reduce;
DDP's bucketing cost 17% of a CPU step), bit for bit as DDP around it would; --grad_compression,
whose hooks need DDP, keeps it. In process, in a real Gloo group of one."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from resnet50_trainer.model.optim import OptimizerSettings, build_optimizer
from resnet50_trainer.model.replica import build_replica
from tests.support.trainer_runs import SMALL_RUN, config_of


@pytest.fixture
def group_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def config_and_replica(tmp_path, *flags: str):
    config = config_of(*SMALL_RUN, "--train_data", "null", "--log_dir", str(tmp_path), *flags)
    return config, build_replica(config, 0, torch.device("cpu"))


def train(module: torch.nn.Module, optimizer: torch.optim.Optimizer, no_sync) -> None:
    """Three steps of two passes each (as --iter_size 2 runs them), on fixed batches."""
    generator = torch.Generator().manual_seed(0)
    module.train()
    for _ in range(3):
        for last in (False, True):
            images = torch.randn(4, 3, 32, 32, generator=generator)
            labels = torch.randint(0, 4, (4,), generator=generator)
            with no_sync() if not last else torch.enable_grad():
                (F.cross_entropy(module(images), labels) / 2).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_one_process_trains_the_model_itself_bit_for_bit_as_ddp(group_of_one, tmp_path):
    config, replica = config_and_replica(tmp_path)
    assert replica.train_module is replica.model
    assert not isinstance(replica.train_model, DistributedDataParallel)
    wrapped_model = copy.deepcopy(replica.model)
    wrapped = DistributedDataParallel(wrapped_model, gradient_as_bucket_view=True)
    wrapped_optimizer = build_optimizer(wrapped_model, OptimizerSettings.of(config))

    train(replica.train_model, replica.optimizer, replica.no_sync)
    train(wrapped, wrapped_optimizer, wrapped.no_sync)
    for (name, ours), theirs in zip(
        replica.model.state_dict().items(), wrapped_model.state_dict().values()
    ):
        assert torch.equal(ours, theirs), name


def test_grad_compression_keeps_ddp_at_one_process(group_of_one, tmp_path):
    _, replica = config_and_replica(tmp_path, "--grad_compression", "fp16")
    assert isinstance(replica.train_module, DistributedDataParallel)
    assert replica.train_module.module is replica.model
    assert replica.compression.mode == "fp16"
