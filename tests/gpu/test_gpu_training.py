"""Training on GPUs: NCCL, precision with an exact resume, tensor cores, torch.compile, model
parallel, peak memory, the checkpoint barrier's limit and a lost peer under NCCL's watchdog. The
GPU tests (pytest -m gpu) are skipped with a reason without CUDA; the device and environment
choices around them are tested on the CPU too.

Exact resume on a GPU: tolerance none. The trainer's processes run with deterministic algorithms
(torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG) and cuDNN's autotuner held off
(tests/support/hooks/sitecustomize.py), on the same GPU, so a resumed run repeats the same kernels
on the
same data and its weights are expected to be bitwise equal to the uninterrupted run's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch

from resnet50_trainer.config.launchers import Launched, gpus_the_machine_holds
from tests.support.dbfactory import write_image_db
from tests.support.gpu import needs_gpu, needs_two_gpus
from tests.support.trainer_runs import (
    HOOKS,
    REPOSITORY,
    RUN_TIMEOUT_S,
    SMALL_RUN,
    config_of,
    model_state,
    pause_before_rename,
    trainer_env,
    training_processes,
    wait_for,
)

GPU_RUN = [flag for flag in SMALL_RUN if flag != "--use_cpu"]
WITH_HOOKS = {"PYTHONPATH": os.pathsep.join([REPOSITORY, HOOKS])}
DETERMINISTIC = {**WITH_HOOKS, "RESNET50_TRAINER_TEST_DETERMINISTIC": "1"}
BARRIER_WARNING = "using the device under current context"  # NCCL's guess without device_id


def gpu_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "resnet50_trainer", *GPU_RUN, *args]


def run_on_gpus(*args: str, **env: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        gpu_command(*args),
        env=trainer_env(**env),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S * 2,
    )
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def gpu_db(module_tmp_path):
    return write_image_db(str(module_tmp_path / "db"), 32, 4)  # 4 steps of 8


# --- the device and environment choices, on any machine ---


def srun(local_rank: int, tasks_here: int) -> Launched:
    return Launched("srun", local_rank, tasks_here, local_rank, tasks_here, None, "job")


@pytest.mark.parametrize(
    ("launched", "visible", "model_parallel", "environ", "holds"),
    [
        (srun(1, 4), 1, False, {"CUDA_VISIBLE_DEVICES": "1"}, 4),  # srun --gpus-per-task 1
        (srun(1, 2), 2, True, {"CUDA_VISIBLE_DEVICES": "2,3"}, 4),  # a pair per task
        (srun(1, 4), 1, False, {}, 1),  # no binding: one GPU here, refused later
        (srun(0, 1), 1, False, {"CUDA_VISIBLE_DEVICES": "0"}, 1),  # alone on its machine
        (srun(1, 4), 4, False, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 4),  # sees them all
        (
            Launched("torchrun", 1, 2, 1, 2, ("h", 1), None),  # binds nothing
            1,
            False,
            {"CUDA_VISIBLE_DEVICES": "0"},
            1,
        ),
    ],
)
def test_a_rank_bound_to_its_own_gpu_stands_for_the_machines_replicas(
    launched, visible, model_parallel, environ, holds
):
    assert gpus_the_machine_holds(launched, visible, model_parallel, environ) == holds


def test_srun_with_a_gpu_per_task_is_accepted_for_every_local_rank(monkeypatch):
    """Each of 4 ranks sees one GPU, its own: every local rank trains on its device 0 (before,
    the ranks were refused: GPU 3 asked for, this machine has 1)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    for local_rank in range(4):
        config = config_of(
            *("--train_data", "null", "--batch_size", "32", "--run_id", "r"),
            gpus_present=1,
            launched=srun(local_rank, 4),
        )
        assert config.processes_per_machine == 4 and len(config.gpus) == 4


def test_cpu_optimizer_is_torchs_default():
    """The fused SGD is for GPUs: on the CPU the kernels (and so the bits) stay as before."""
    from resnet50_trainer.model.optim import OptimizerSettings, build_optimizer

    config = config_of("--use_cpu", "--train_data", "null")
    optimizer = build_optimizer(torch.nn.Linear(2, 2), OptimizerSettings.of(config))
    assert optimizer.defaults["fused"] is None and optimizer.defaults["foreach"] is None


def test_a_cpu_run_resumed_from_a_gpu_checkpoint_keeps_its_own_kernels():
    """A checkpoint's param groups carry the kernel choice of the run that saved it: a GPU's
    fused one must not switch a CPU run to CPU's fused SGD (other bits than before), nor a CPU's
    default keep a GPU run from the fused one."""
    from resnet50_trainer.model.optim import OptimizerSettings, build_optimizer

    config = config_of("--use_cpu", "--train_data", "null")
    optimizer = build_optimizer(torch.nn.Linear(2, 2), OptimizerSettings.of(config))
    saved_on_a_gpu = optimizer.state_dict()
    for group in saved_on_a_gpu["param_groups"]:
        group["fused"] = True
    optimizer.load_state_dict(saved_on_a_gpu)
    assert [group["fused"] for group in optimizer.param_groups] == [None] * 2


# --- on a GPU ---


@needs_gpu
def test_fused_sgd_steps_float16_without_a_host_sync():
    """The gradient scaler's step with the fused SGD reads nothing back to the host (unfused, its
    found-inf .item() synchronises every step)."""
    from resnet50_trainer.model.optim import OptimizerSettings, build_optimizer
    from resnet50_trainer.model.precision import Precision, PrecisionSettings
    from resnet50_trainer.model.resnet import Architecture, model_for

    config = config_of("--train_data", "null", "--dtype", "float16", gpus_present=1)
    device = torch.device("cuda", 0)
    model = model_for(Architecture.of(config)).to(device)
    precision, optimizer = (
        Precision(PrecisionSettings.of(config), device),
        build_optimizer(model, OptimizerSettings.of(config)),
    )
    assert optimizer.defaults["fused"] is True
    images = torch.randint(0, 255, (8, 3, 32, 32), dtype=torch.uint8, device=device)
    labels = torch.zeros(8, dtype=torch.long, device=device)
    for step in range(2):  # the first step creates the scale and the momentum
        with precision.autocast():
            loss = torch.nn.functional.cross_entropy(model(precision.inputs(images)), labels)
        precision.backward(loss)
        torch.cuda.set_sync_debug_mode("error" if step else "default")
        try:
            precision.step(optimizer)
        finally:
            torch.cuda.set_sync_debug_mode("default")


@needs_gpu
def test_a_float16_step_the_scaler_skips_leaves_the_fused_sgd_where_the_unfused_one_is():
    """float16's first steps overflow as a rule and the scaler skips them: the fused SGD's momentum
    must not then start from unwritten memory (model/optim.py, start_momentum_at_zero; without
    it, weights of 2e35 by the third step on an H100)."""
    from resnet50_trainer.model.optim import OptimizerSettings, build_optimizer
    from resnet50_trainer.model.resnet import weight_decay_groups

    settings = OptimizerSettings.of(config_of("--train_data", "null", gpus_present=1))
    generator = torch.Generator().manual_seed(0)
    fused_model = torch.nn.Linear(512, 10).cuda()
    unfused_model = torch.nn.Linear(512, 10).cuda()
    unfused_model.load_state_dict(fused_model.state_dict())
    fused = build_optimizer(fused_model, settings)
    unfused = torch.optim.SGD(
        weight_decay_groups(unfused_model),
        lr=settings.learning_rate,
        momentum=settings.momentum,
        nesterov=settings.nesterov,
        weight_decay=settings.weight_decay,
    )
    assert fused.defaults["fused"] and not unfused.defaults["fused"]
    batches = [torch.randn(8, 512, generator=generator).cuda() for _ in range(3)]
    for model, optimizer in ((fused_model, fused), (unfused_model, unfused)):
        scaler = torch.amp.GradScaler("cuda")
        for step, batch in enumerate(batches):
            with torch.autocast("cuda", torch.float16):
                loss = model(batch).float().square().mean()
            scaler.scale(loss).backward()
            if step == 0:
                grad = model.weight.grad
                assert grad is not None
                grad[0, 0] = float("inf")
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
    torch.testing.assert_close(fused_model.weight, unfused_model.weight)


@needs_gpu
@pytest.mark.parametrize(
    "flags",
    [
        ["--dtype", "bfloat16", "--enable_tensor_core"],
        ["--dtype", "float16"],  # the gradient scaler: fused SGD, no found-inf read
        ["--decode_device", "gpu"],
    ],
    ids=["bfloat16", "float16", "gpu_decode"],
)
def test_the_steps_between_two_divergence_checks_never_sync_the_host(tmp_path, flags):
    """A whole run's steps, not one part: from the end of the 2nd optimizer step to the end of the
    19th, every host sync raises (tests/support/hooks: set_sync_debug_mode("error")): the loop
    between steps, the input pipeline's hand-over to the GPU, the steps. The divergence check
    reads the device by design once every STOP_CHECK_EVERY_ITERS (20) steps and the epoch's end
    reads its totals (30 steps of 8): both lie outside the window."""
    from resnet50_trainer.train.epoch_loop import STOP_CHECK_EVERY_ITERS

    database = write_image_db(str(tmp_path / "db"), 240, 4)
    run_on_gpus(
        *("--train_data", database, "--num_gpus", "1", "--num_epochs", "1", *flags),
        *("--log_dir", str(tmp_path / "out")),
        **WITH_HOOKS,
        RESNET50_TRAINER_TEST_NO_SYNC_STEPS=f"2:{STOP_CHECK_EVERY_ITERS - 3}",
    )


@needs_gpu
@pytest.mark.parametrize("tensor_core", [False, True])
def test_tf32_follows_enable_tensor_core_both_ways(tensor_core):
    from resnet50_trainer.model.precision import Precision, PrecisionSettings

    flags = ["--enable_tensor_core"] if tensor_core else []
    Precision(
        PrecisionSettings.of(config_of("--train_data", "null", *flags, gpus_present=1)),
        torch.device("cuda", 0),
    )
    assert torch.backends.cudnn.allow_tf32 is tensor_core
    assert torch.backends.cuda.matmul.allow_tf32 is tensor_core


@needs_gpu
@pytest.mark.parametrize("limit", [None, "256"])
def test_cudnn_workspace_is_capped_only_when_asked(monkeypatch, limit):
    from resnet50_trainer.distributed.devices import claim_device

    monkeypatch.delenv("CUDNN_CONV_WSCAP_DBG", raising=False)
    flags = ["--cudnn_workspace_limit_mb", limit] if limit else []
    claim_device(config_of("--train_data", "null", *flags, gpus_present=1), 0)
    assert os.environ.get("CUDNN_CONV_WSCAP_DBG") == limit


@needs_gpu
def test_nccl_with_one_process(gpu_db, tmp_path):
    done = run_on_gpus("--train_data", gpu_db, "--num_epochs", "1", "--log_dir", str(tmp_path))
    assert BARRIER_WARNING not in done.stderr, done.stderr  # device_id given at the group's start
    torch.load(tmp_path / "resnet50_model_1.pt", weights_only=True)


@needs_two_gpus
def test_nccl_with_two_processes(gpu_db, tmp_path):
    done = run_on_gpus(
        *("--train_data", gpu_db, "--num_gpus", "2", "--num_epochs", "1"),
        *("--log_dir", str(tmp_path)),
    )
    assert BARRIER_WARNING not in done.stderr, done.stderr


def _share_one_gpu(rank: int, port: int) -> None:
    """One of 2 processes on cuda:0 under Gloo (NCCL refuses two ranks on one GPU): the run's
    collectives on CUDA tensors, the checkpoint barrier's long limit included."""
    import datetime

    import torch.distributed as dist

    from resnet50_trainer.distributed import process_group
    from resnet50_trainer.distributed.stopping import StoppedByFirst, stop_together
    from resnet50_trainer.errors import UserError

    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    config = config_of("--train_data", "null", "--timeout", "1", gpus_present=1)
    process_group.shorten_timeout(config)
    with process_group.long_wait(config):
        stop_together(None, device)
    torch.manual_seed(0)
    process_group.parameters_digest_everywhere(torch.nn.Linear(4, 4).to(device))
    try:
        stop_together(UserError("the first one's write failed") if rank == 0 else None, device)
    except (UserError, StoppedByFirst):
        pass
    else:
        raise AssertionError("stop_together let a failed write pass")
    dist.destroy_process_group()


@needs_gpu
def test_gloo_with_two_processes_sharing_one_gpu():
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.start_processes(_share_one_gpu, args=(port,), nprocs=2, start_method="spawn")


@needs_gpu
def test_two_training_processes_forked_with_cuda_share_one_gpu_and_resume(gpu_db, tmp_path):
    """--gpus 0,0: two training processes started from the fork server the way --num_gpus 2
    starts them, each with its input process, both on cuda:0 (Gloo between them); an epoch, then
    a resume to the second, each ending with the replicas' weights equal."""
    common = ("--train_data", gpu_db, "--gpus", "0,0", "--num_workers", "1")
    first = run_on_gpus(*common, "--num_epochs", "1", "--log_dir", str(tmp_path))
    assert "ResNet-18, 2 processes x 4 images" in first.stderr, first.stderr
    assert "on cuda:0" in first.stderr and "Traceback" not in first.stderr, first.stderr
    resumed = run_on_gpus(
        *common,
        *("--num_epochs", "2", "--load_model_path", str(tmp_path / "resnet50_model_1.pt")),
        *("--log_dir", str(tmp_path / "resumed")),
    )
    for done in (first, resumed):
        assert "Parameters identical on all 2 processes" in done.stderr, done.stderr
    assert (tmp_path / "resumed" / "resnet50_model_2.pt").exists()


@needs_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_exact_resume_on_the_gpu(gpu_db, tmp_path, dtype):
    """2 epochs in one go against epoch 1's checkpoint resumed to 2: the same weights, bit for bit
    (see the module's note on the tolerance)."""
    common = ("--train_data", gpu_db, "--dtype", dtype, "--num_epochs", "2")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_on_gpus(*common, "--keep_checkpoints", "5", "--log_dir", str(straight), **DETERMINISTIC)
    run_on_gpus(
        *common,
        *("--load_model_path", str(straight / "resnet50_model_1.pt")),
        *("--log_dir", str(resumed)),
        **DETERMINISTIC,
    )
    expected, got = (model_state(out / "resnet50_model_2.pt") for out in (straight, resumed))
    assert expected.keys() == got.keys()
    differing = [name for name in expected if not torch.equal(expected[name], got[name])]
    assert not differing, differing


@needs_gpu
@pytest.mark.parametrize(
    "flags",
    [["--enable_tensor_core"], ["--enable_tensor_core", "--compile"]],
    ids=["tc", "compile"],
)
def test_tensor_cores_and_compile(gpu_db, tmp_path, flags):
    run_on_gpus("--train_data", gpu_db, "--num_epochs", "1", "--log_dir", str(tmp_path), *flags)
    torch.load(tmp_path / "resnet50_model_1.pt", weights_only=True)


@needs_two_gpus
def test_model_parallel_on_two_gpus(gpu_db, tmp_path):
    run_on_gpus(
        *("--train_data", gpu_db, "--num_epochs", "1", "--log_dir", str(tmp_path)),
        *("--model_parallel", "--gpus", "0,1", "--pipeline_chunks", "2"),
    )


@needs_gpu
def test_peak_memory_of_resnet50_at_batch_256_in_bfloat16():
    """Recorded, not judged: ResNet-50, 224 px, batch 256, bfloat16 autocast, 3 steps."""
    from resnet50_trainer.model.optim import OptimizerSettings, build_optimizer
    from resnet50_trainer.model.precision import Precision, PrecisionSettings
    from resnet50_trainer.model.resnet import Architecture, model_for

    config = config_of(
        *("--train_data", "null", "--num_layers", "50", "--image_size", "224"),
        *("--batch_size", "256", "--dtype", "bfloat16", "--num_labels", "1000"),
        gpus_present=1,
    )
    device = torch.device("cuda", 0)
    model = model_for(Architecture.of(config)).to(device)
    precision, optimizer = (
        Precision(PrecisionSettings.of(config), device),
        build_optimizer(model, OptimizerSettings.of(config)),
    )
    images = torch.randint(0, 255, (256, 3, 224, 224), dtype=torch.uint8, device=device)
    labels = torch.randint(0, 1000, (256,), device=device)
    torch.cuda.reset_peak_memory_stats(device)
    for _ in range(3):
        optimizer.zero_grad(set_to_none=True)
        with precision.autocast():
            loss = torch.nn.functional.cross_entropy(model(precision.inputs(images)), labels)
        precision.backward(loss)
        precision.step(optimizer)
    peak = torch.cuda.max_memory_allocated(device)
    print(f"peak GPU memory, ResNet-50 batch 256 224 px bfloat16: {peak / 2**30:.2f} GiB")
    assert 2**30 < peak < torch.cuda.get_device_properties(device).total_memory


@needs_two_gpus
def test_a_checkpoint_slower_than_timeout_survives_nccls_watchdog(gpu_db, tmp_path):
    run_on_gpus(
        *("--train_data", gpu_db, "--num_gpus", "2", "--num_epochs", "1"),
        *("--timeout", "2", "--log_dir", str(tmp_path)),
        **pause_before_rename(8),  # 4 x --timeout
    )
    torch.load(tmp_path / "resnet50_model_1.pt", weights_only=True)


@needs_two_gpus
def test_a_silent_peer_under_nccl_is_reported_as_a_lost_peer(gpu_db, tmp_path):
    """NCCL never raises in Python for a silent peer: its watchdog aborts the waiting process
    (SIGABRT). The launcher names that a lost peer in one line, not a process killed by SIGABRT."""
    run = subprocess.Popen(
        gpu_command(
            *("--train_data", gpu_db, "--num_gpus", "2", "--num_epochs", "1000"),
            *("--timeout", "5", "--log_dir", str(tmp_path)),
        ),
        env=trainer_env(),
        text=True,
        stderr=subprocess.PIPE,
    )
    stopped = []
    try:
        wait_for(lambda: (tmp_path / "resnet50_model_1.pt").exists(), 300, "the first checkpoint")
        stopped = training_processes(run.pid)[1:]
        os.kill(stopped[0], signal.SIGSTOP)
        _, stderr = run.communicate(timeout=180)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGKILL)
        run.kill()
    assert run.returncode == 1, stderr
    assert "training process of rank 0" in stderr and "was lost or stopped answering" in stderr
    assert "killed by SIGABRT" not in stderr, stderr
