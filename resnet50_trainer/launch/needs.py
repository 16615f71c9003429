"""What a run needs of this machine's limits, from its settings: room in /dev/shm for the batches
input processes hand over, open files, threads and processes, memory mapped. Checked in the
launching process before any training process starts, where a limit too small for the run ends
it in one line (exit 2); what shows only later is named where it happens (limits.py). Each need
is an estimate set above what runs used (docs/many-machines.md, Limits of the machine, has the
measurements); what a process maps is reckoned from this one's, torch imported."""

from __future__ import annotations

import math
import resource
from dataclasses import dataclass

import torch

from resnet50_trainer import limits, machine
from resnet50_trainer.config.settings import Config
from resnet50_trainer.errors import UserError

PAGE = resource.getpagesize()
# Batches a training process may hold from its input processes at once: PREFETCH_FACTOR asked of
# each ahead (the DataLoader's default), and the one it trains on and the one after.
PREFETCH_FACTOR = 2
BATCHES_HELD = 2
# multiprocessing's semaphores, a page each in /dev/shm: a loader's result queue and its end
# event, each input process's queue; the launcher's, and its training processes' error queues.
LOADER_SEMAPHORES = 8
SEMAPHORES_PER_INPUT_PROCESS = 3
LAUNCHER_SEMAPHORES = 4
SEMAPHORES_PER_TRAINING_PROCESS = 4
# A training process's open files: the interpreter's, the DBs', the log's and lock's, the
# store's; each input process's queue ends and sentinel; a batch's two shared-memory objects
# (images, labels), each passed as a file descriptor; a socket to each peer.
OPEN_FILES = 32
OPEN_FILES_PER_INPUT_PROCESS = 5
OPEN_FILES_PER_BATCH = 2
OPEN_FILES_PER_PEER = 2
# A training process's threads besides torch's compute threads and one per input process (Gloo's,
# the heartbeat, the progress bar's, the loader's); an input process and its threads (queue
# feeder, resource sharer); the launcher of several, its fork server and resource tracker.
THREADS = 8
TASKS_PER_INPUT_PROCESS = 4
LAUNCHER_TASKS = 8
# What a training process maps besides what the launcher has mapped as it checks (torch, not
# yet torchvision and the training code): those, the model, its gradients and momentum; each
# thread's stack and allocator arena; the activations of ResNet-50 in float32 on the CPU, per
# pixel of each image of a batch (deeper ResNets more, in proportion). Of it, the private and
# writable part (RLIMIT_DATA) leaves out libraries' code and arenas reserved but not written.
ADDRESS_SPACE = 1 << 30
ADDRESS_SPACE_PER_THREAD = 48 << 20
DATA = 768 << 20
DATA_PER_THREAD = 8 << 20
ACTIVATION_BYTES_PER_PIXEL = 1800
ACTIVATIONS_MEASURED_DEPTH = 50
FLOAT32 = 4
CHECKPOINT_OVERHEAD = 1 << 20  # the settings, the run's position and totals, pickle's framing


@dataclass(frozen=True)
class Needs:
    shared_memory: int  # bytes of /dev/shm, all this machine's training processes together
    open_files: int  # in each training process (its input processes inherit them)
    tasks: int  # threads and processes, all this machine's training processes together
    # Bytes each training process maps beyond what the launcher has as it checks: all of it
    # (resource.RLIMIT_AS) and its private writable part (resource.RLIMIT_DATA).
    maps: dict[int, int]


def check_limits(config: Config) -> None:
    """UserError naming the first of this machine's limits below what the run needs."""
    needs = needs_of(config)
    unusable = limits.shared_memory_unusable()
    if needs.shared_memory and unusable:
        raise UserError(unusable)
    if needs.shared_memory > machine.shared_memory_room()[1]:
        raise UserError(limits.shared_memory_shortage(needs.shared_memory))
    for _, limit, in_use in machine.task_limits():
        if in_use + needs.tasks > limit:
            raise UserError(limits.tasks_shortage(needs.tasks))
    for mapping in machine.mapping_limits():
        needed = mapping.mapped + needs.maps[mapping.resource]
        if needed > mapping.limit:
            raise UserError(limits.mapping_shortage(mapping, needed))
    if needs.open_files > machine.soft_limit(resource.RLIMIT_NOFILE):
        raise UserError(limits.rlimit_shortage(resource.RLIMIT_NOFILE, needs.open_files))
    if machine.soft_limit(resource.RLIMIT_FSIZE) < math.inf and not config.test_only:
        checkpoint = checkpoint_bytes(config)
        if checkpoint > machine.soft_limit(resource.RLIMIT_FSIZE):
            raise UserError(limits.rlimit_shortage(resource.RLIMIT_FSIZE, checkpoint))


def needs_of(config: Config) -> Needs:
    processes = config.processes_per_machine
    loaders = _loaders(config)
    input_processes = config.num_workers * len(loaders)
    in_flight = PREFETCH_FACTOR * config.num_workers + BATCHES_HELD
    largest_batch = max((_batch_bytes(config, size) for size in loaders), default=0)
    shared_memory = 0
    if config.num_workers:
        semaphores = len(loaders) * (
            LOADER_SEMAPHORES + SEMAPHORES_PER_INPUT_PROCESS * config.num_workers
        )
        shared_memory = in_flight * largest_batch + semaphores * PAGE
    launcher = processes > 1
    threads = THREADS + torch.get_num_threads() + input_processes
    activations = _activations(config)
    return Needs(
        shared_memory=processes * shared_memory
        + launcher * (LAUNCHER_SEMAPHORES + SEMAPHORES_PER_TRAINING_PROCESS * processes) * PAGE,
        open_files=OPEN_FILES
        + OPEN_FILES_PER_INPUT_PROCESS * input_processes
        + OPEN_FILES_PER_BATCH * (in_flight if config.num_workers else 0)
        + OPEN_FILES_PER_PEER * config.world_size,
        tasks=processes * (threads + TASKS_PER_INPUT_PROCESS * input_processes)
        + launcher * LAUNCHER_TASKS,
        maps={
            resource.RLIMIT_AS: ADDRESS_SPACE + ADDRESS_SPACE_PER_THREAD * threads + activations,
            resource.RLIMIT_DATA: DATA + DATA_PER_THREAD * threads + activations,
        },
    )


def _loaders(config: Config) -> list[int]:
    """The image size of each input pipeline a training process runs: training's and the test's."""
    sizes = [] if config.test_only or config.synthetic else [config.image_size]
    if config.test_data is not None:
        sizes.append(config.test_sizes[1])
    return sizes


def _batch_bytes(config: Config, image_size: int) -> int:
    """A batch in shared memory: its uint8 images and its labels, each rounded up to pages."""
    images = config.device_batch_size * image_size * image_size * config.num_channels
    return -(-images // PAGE) * PAGE + PAGE


def checkpoint_bytes(config: Config) -> int:
    """A checkpoint's size: the weights and buffers, the momentum, the EMA's copy, in float32.
    Only where a file-size limit is set: the model's module imports torchvision (seconds), which
    the launcher of several processes otherwise never does."""
    from resnet50_trainer.model.resnet import model_shapes

    model = model_shapes(config)
    weights = sum(parameter.numel() for parameter in model.parameters())
    buffers = sum(buffer.numel() for buffer in model.buffers())
    copies = 2 if config.ema_decay else 1
    return FLOAT32 * (copies * (weights + buffers) + weights) + CHECKPOINT_OVERHEAD


def _activations(config: Config) -> int:
    depth = max(1.0, config.num_layers / ACTIVATIONS_MEASURED_DEPTH)
    pixels = config.device_batch_size * config.image_size * config.image_size
    return int(pixels * ACTIVATION_BYTES_PER_PIXEL * depth)
