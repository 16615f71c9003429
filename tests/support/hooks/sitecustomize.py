"""Test-only fault injection, loaded at start-up by every Python process of a run whose PYTHONPATH
holds this directory (trainer_runs.pause_before_rename): the training processes inherit it from
their fork server.

Each rename of a checkpoint's temporary file (`.tmp-<checkpoint>.pt-<random>.pt`, as
checkpoint.save_checkpoint names it) first sleeps RESNET50_TRAINER_TEST_PAUSE_BEFORE_RENAME
seconds: the writer is held between its fsync and its rename, where a test can kill it or start a
second run beside it; not in a requeued Slurm job (SLURM_RESTART_COUNT above 0), whose run only
has to finish. The trainer itself knows nothing of this."""

from __future__ import annotations

import itertools
import os
import re
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import StrOrBytesPath

PAUSE_ENV = "RESNET50_TRAINER_TEST_PAUSE_BEFORE_RENAME"
_CHECKPOINT_TEMPORARY = re.compile(r"\.tmp-.+\.pt-[a-z0-9_]{8}\.pt")
_pause_s = (
    float(os.environ.get(PAUSE_ENV, 0)) if os.environ.get("SLURM_RESTART_COUNT", "0") == "0" else 0
)
_replace = os.replace


def _replace_after_a_pause(
    src: StrOrBytesPath,
    dst: StrOrBytesPath,
    *,
    src_dir_fd: int | None = None,
    dst_dir_fd: int | None = None,
) -> None:
    if _CHECKPOINT_TEMPORARY.fullmatch(os.path.basename(os.fsdecode(src))):
        time.sleep(_pause_s)
    _replace(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)


if _pause_s:
    os.replace = _replace_after_a_pause

# "RANK:STEPS": the training process of that global rank, in torchrun's first round (restart
# count 0), SIGKILLs itself after its STEPS-th optimizer step; a restarted round runs on.
KILL_ENV = "RESNET50_TRAINER_TEST_KILL_AFTER_STEPS"


def _after_each_optimizer_step(act) -> None:
    """act(n) once this process's n-th optimizer step has ended."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    done = itertools.count(1)
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: act(next(done)))


def _kill_after_steps(steps: int) -> None:
    import signal

    def kill(step: int) -> None:
        if step == steps:
            os.kill(os.getpid(), signal.SIGKILL)

    _after_each_optimizer_step(kill)


if os.environ.get(KILL_ENV) and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
    _rank, _steps = os.environ[KILL_ENV].split(":")
    if os.environ.get("RANK") == _rank:
        _kill_after_steps(int(_steps))

# "1": deterministic GPU arithmetic, for exact-resume tests on a GPU: deterministic algorithms
# (cuBLAS with its fixed workspace), and cuDNN's autotuner held off, whose timing-based choice
# among deterministic algorithms may differ from one process to the next.
DETERMINISTIC_ENV = "RESNET50_TRAINER_TEST_DETERMINISTIC"

if os.environ.get(DETERMINISTIC_ENV) == "1":
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    import torch

    torch.use_deterministic_algorithms(True)
    # torch.backends.cudnn is an instance of a module subclass (CudnnModule) whose class holds the
    # `benchmark` property; its stubs describe a plain module.
    type(torch.backends.cudnn).benchmark = property(  # type: ignore[attr-defined]
        lambda self: False, lambda self, value: None
    )

# "FIRST:COUNT": from the end of optimizer step FIRST to the end of step FIRST + COUNT, any host
# sync raises (torch.cuda.set_sync_debug_mode("error")): the training loop between two steps, the
# input pipeline's hand-over and the steps themselves must queue work without waiting on the GPU.
SYNC_DEBUG_ENV = "RESNET50_TRAINER_TEST_NO_SYNC_STEPS"


def _no_sync_between(first: int, count: int) -> None:
    import torch

    def window(step: int) -> None:
        if step == first:
            torch.cuda.set_sync_debug_mode("error")
        elif step == first + count:
            torch.cuda.set_sync_debug_mode("default")

    _after_each_optimizer_step(window)


if os.environ.get(SYNC_DEBUG_ENV):
    _first, _count = os.environ[SYNC_DEBUG_ENV].split(":")
    _no_sync_between(int(_first), int(_count))

# Seconds preflight reads each DB's labels (launch/preflight.py's LABEL_SCAN_S and
# TRAINING_LABEL_SCAN_S): "0" leaves every training label to training's own check as it reads them.
LABEL_SCAN_ENV = "RESNET50_TRAINER_TEST_LABEL_SCAN_S"
if os.environ.get(LABEL_SCAN_ENV):
    from resnet50_trainer.launch import preflight

    preflight.LABEL_SCAN_S = float(os.environ[LABEL_SCAN_ENV])
    preflight.TRAINING_LABEL_SCAN_S = float(os.environ[LABEL_SCAN_ENV])

# "STEPS:SIGNAL:INDEX:TARGET": this machine's training process of that INDEX (0: the only one, or
# the first started) sends SIGNAL (a name: SIGTERM, SIGUSR1, SIGTSTP) after its STEPS-th optimizer
# step to TARGET: "self", "group" (its whole process group, as Slurm does) or "launcher" (the
# process that started it). A signal at a known step, not at a known time.
SIGNAL_ENV = "RESNET50_TRAINER_TEST_SIGNAL_AFTER_STEPS"
# The same, after the STEPS-th batch the model scores in evaluation mode (--test_only's steps).
TEST_SIGNAL_ENV = "RESNET50_TRAINER_TEST_SIGNAL_AFTER_TEST_BATCHES"


def _training_process_index() -> int | None:
    import multiprocessing

    name = multiprocessing.current_process().name
    if name == "MainProcess":
        return 0
    prefix = "ForkServerProcess-"
    return int(name[len(prefix) :]) - 1 if name.startswith(prefix) else None


def _launcher() -> int:
    """The launcher of this (forked) training process: its fork server's parent."""
    with open(f"/proc/{os.getppid()}/stat") as file:
        return int(file.read().rsplit(")", 1)[1].split()[1])


def _signal_at(steps: int, signum: int, index: int, target: str):
    """send(n): the signal, when n is STEPS in the training process of that index."""

    def send(step: int) -> None:
        # Known only once training: a forked process is named after sitecustomize has run.
        if step != steps or _training_process_index() != index:
            return
        if target == "group":
            os.killpg(os.getpgid(0), signum)
        else:
            os.kill(_launcher() if target == "launcher" else os.getpid(), signum)

    return send


def _after_each_test_batch(act) -> None:
    """act(n) once the model (torchvision's ResNet, in eval mode) has scored its n-th batch."""
    from torch.nn.modules.module import register_module_forward_hook

    done = itertools.count(1)

    def scored(module, args, output) -> None:
        if type(module).__name__ == "ResNet" and not module.training:
            act(next(done))

    register_module_forward_hook(scored)


for _env, _trigger in (
    (SIGNAL_ENV, _after_each_optimizer_step),
    (TEST_SIGNAL_ENV, _after_each_test_batch),
):
    if os.environ.get(_env):
        import signal as _signal

        _steps, _name, _index, _target = os.environ[_env].split(":")
        _trigger(_signal_at(int(_steps), _signal.Signals[_name], int(_index), _target))

# "MODULE:SIGNAL": a process of the run that imports MODULE itself (not forked from one that did)
# sends SIGNAL (a name: SIGINT) to its whole process group (a Ctrl-C in a terminal) as that import
# begins: a signal while a process imports, not at a known time.
IMPORT_SIGNAL_ENV = "RESNET50_TRAINER_TEST_SIGNAL_AS_IMPORTED"


class _SignalAsImported:
    """A finder that finds nothing: it sends the signal as the import of its module begins."""

    def __init__(self, module: str, signum: int):
        self.module, self.signum = module, signum

    def find_spec(self, fullname: str, path: object, target: object = None) -> None:
        if fullname == self.module:
            sys.meta_path.remove(self)
            os.killpg(os.getpgid(0), self.signum)


if os.environ.get(IMPORT_SIGNAL_ENV):
    import signal as _signal
    import sys

    _module, _name = os.environ[IMPORT_SIGNAL_ENV].split(":")
    sys.meta_path.insert(0, _SignalAsImported(_module, _signal.Signals[_name]))

# "STEPS:FAULT:INDEX": this machine's training process of that INDEX, after its STEPS-th optimizer
# step, meets a fault of its machine: "crash" (native code reads address 0: SIGSEGV) or "grow" (it
# takes memory, 64 MiB at a time, until the kernel's OOM killer ends it).
FAULT_ENV = "RESNET50_TRAINER_TEST_FAULT_AFTER_STEPS"


def _fault_at(steps: int, fault: str, index: int):
    def meet(step: int) -> None:
        if step != steps or _training_process_index() != index:
            return
        if fault == "crash":
            import ctypes

            ctypes.string_at(0)
        held = []
        while True:
            held.append(b"\1" * (64 << 20))  # written, so its pages are taken

    return meet


if os.environ.get(FAULT_ENV):
    _steps, _fault, _index = os.environ[FAULT_ENV].split(":")
    _after_each_optimizer_step(_fault_at(int(_steps), _fault, int(_index)))
