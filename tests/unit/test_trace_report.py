"""The profile's analysis (reporting/trace_report.py) on traces written as torch.profiler writes
them: host spans on threads, launches paired with the GPU work they queued by correlation id."""

from __future__ import annotations

import pytest

from resnet50_trainer.data.spans import COPY_TO_DEVICE, WAIT_FOR_BATCH
from resnet50_trainer.reporting.trace_host import (
    ALLOCATIONS,
    COLLECTIVES,
    COPYING_INPUT,
    EVALUATING,
    FORWARD_BACKWARD,
    HOST_OVERHEAD,
    OPTIMIZER,
    SAVING,
    SYNCS,
    WAITING_FOR_INPUT,
)
from resnet50_trainer.reporting.trace_report import BETWEEN_KERNELS, read_trace

HOST = {"pid": 100, "tid": 100}
AUTOGRAD = {"pid": 100, "tid": 101}


class Trace:
    """A trace under construction: host spans, and launches with the kernel each queued."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.correlation = 0

    def host(self, name: str, start: float, end: float, cat: str = "cpu_op", thread=HOST):
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "ts": start, "dur": end - start, **thread}
        )

    def kernel(
        self, name: str, launched: float, start: float, end: float, thread=HOST, cat="kernel"
    ):
        """A launch on `thread` at `launched` (2 µs long) of GPU work running start..end."""
        self.correlation += 1
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "ts": launched,
                "dur": 2,
                "args": {"correlation": self.correlation},
                **thread,
            }
        )
        self.events.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "ts": start,
                "dur": end - start,
                "pid": 0,
                "tid": 7,
                "args": {"device": 0, "stream": 7, "correlation": self.correlation},
            }
        )

    def read(self):
        return read_trace({"traceEvents": self.events})


def test_kernels_queued_ahead_leave_only_the_gpus_own_gaps():
    trace = Trace()
    trace.host("ProfilerStep#1", 100, 530, "user_annotation")
    for index in range(4):  # all queued before the step, run back to back with 10 µs between
        trace.kernel(
            "void at::native::add_kernel<float>", 10 + index, 100 + index * 110, 200 + index * 110
        )
    report = trace.read()
    assert report.device == "GPU 0"
    assert report.gpu_window == pytest.approx(430)
    assert report.busy == pytest.approx(400)
    assert report.idle == {BETWEEN_KERNELS: pytest.approx(30)}
    assert "busy 93% of the time, idle 7% (between queued kernels 7%)" in report.line()


def test_a_late_launch_is_blamed_on_what_its_thread_was_doing():
    """The GPU idles from 100 to 600: the next kernel's launch came at 590, after the training
    thread waited for a batch (150..400) and for the GPU (400..500); the rest is overhead."""
    trace = Trace()
    trace.host("ProfilerStep#1", 10, 700, "user_annotation")
    trace.kernel("conv", 5, 10, 100)
    trace.host(WAIT_FOR_BATCH, 150, 400, "user_annotation")
    trace.host("cudaStreamSynchronize", 400, 500, "cuda_runtime")
    trace.kernel("relu", 590, 600, 700)
    report = trace.read()
    assert report.idle == {
        WAITING_FOR_INPUT: pytest.approx(250),
        SYNCS: pytest.approx(100),
        HOST_OVERHEAD: pytest.approx(150),  # 100..150, 500..590, and the launch's 590..600
    }
    (gap,) = report.gaps
    assert (gap.at, gap.idle, gap.cause) == (
        pytest.approx(90),
        pytest.approx(500),
        WAITING_FOR_INPUT,
    )
    assert gap.host_call == WAIT_FOR_BATCH  # the innermost span over most of the wait


def test_a_cause_nested_in_another_counts_once_by_precedence():
    """A sync inside the optimizer is a sync; inside the input's copy, the copy's."""
    trace = Trace()
    trace.host("ProfilerStep#1", 0, 1000, "user_annotation")
    trace.kernel("k", 0, 0, 100)
    trace.host("Optimizer.step#SGD.step", 100, 300, "user_annotation")
    trace.host("cudaStreamSynchronize", 150, 250, "cuda_runtime")
    trace.host(COPY_TO_DEVICE, 300, 400, "user_annotation")
    trace.host("cudaStreamSynchronize", 320, 380, "cuda_runtime")
    trace.host("cudaMalloc", 400, 450, "cuda_runtime")
    trace.kernel("k", 450, 450, 500)
    idle = trace.read().idle
    assert idle[SYNCS] == pytest.approx(100)
    assert idle[OPTIMIZER] == pytest.approx(100)
    assert idle[COPYING_INPUT] == pytest.approx(100)
    assert idle[ALLOCATIONS] == pytest.approx(50)


def test_a_launch_from_the_autograd_thread_is_judged_by_that_thread():
    trace = Trace()
    trace.host("ProfilerStep#1", 0, 500, "user_annotation")
    trace.host(WAIT_FOR_BATCH, 100, 500, "user_annotation")  # the training thread, not the launcher
    trace.kernel("a", 0, 0, 100)
    trace.host(
        "autograd::engine::evaluate_function: ConvolutionBackward0", 90, 400, thread=AUTOGRAD
    )
    trace.kernel("b", 390, 400, 500, thread=AUTOGRAD)
    report = trace.read()
    assert report.idle == {HOST_OVERHEAD: pytest.approx(300)}
    assert report.gaps[0].host_call.startswith("autograd::engine")


def test_kernels_are_grouped_by_what_launched_them_and_the_precision_their_names_carry():
    trace = Trace()
    trace.host("ProfilerStep#1", 0, 10_000, "user_annotation")
    trace.host("aten::cudnn_convolution", 0, 10)
    trace.kernel("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwc", 1, 10, 110)
    trace.host("aten::native_batch_norm", 20, 30)
    trace.kernel(
        "void at::native::batch_norm_collect_statistics_channels_last_kernel<c10::BFloat16, float>",
        21,
        110,
        140,
    )
    trace.host("aten::cudnn_batch_norm", 40, 50)
    trace.kernel("void cudnn::bn_fw_tr_1C11_singleread_spec<__half, 512>", 41, 140, 150)
    trace.host("Optimizer.step#SGD.step", 60, 70, "user_annotation")
    trace.kernel("void at::native::fused_sgd_kernel<float>", 61, 150, 160)
    trace.host(COPY_TO_DEVICE, 80, 90, "user_annotation")
    trace.kernel("Memcpy HtoD (Pinned -> Device)", 81, 160, 200, cat="gpu_memcpy")
    groups = {(g.kind, g.backend, g.precision): (g.count, g.time) for g in trace.read().kernels}
    assert groups == {
        ("convolution", "cuDNN", "bfloat16"): (1, 100),
        ("batch norm", "PyTorch", "bfloat16"): (1, 30),
        ("batch norm", "cuDNN", "float16"): (1, 10),
        ("optimizer", "PyTorch", "float32"): (1, 10),
        ("Memcpy HtoD", "-", "-"): (1, 40),
    }


def test_the_table_names_each_part_and_the_longest_gaps():
    trace = Trace()
    for step in range(2):
        base = step * 1000
        trace.host(f"ProfilerStep#{step + 1}", base, base + 1000, "user_annotation")
        trace.kernel("conv_bf16", base + 5, base + 10, base + 500)
        trace.host(WAIT_FOR_BATCH, base + 500, base + 900, "user_annotation")
        trace.kernel("conv_bf16", base + 900, base + 910, base + 1000)
    table = trace.read().table("Profile of x")
    assert table.startswith("# Profile of x\n\n2 steps, ")
    assert "| idle: waiting for input | 0.40 | " in table  # ms a step
    assert "| other | other library | bfloat16 | 2 | 0.58 | 100.0% |" in table
    # Each step's wait for its batch, and the launches' own latency at each step's start.
    assert "Its 4 longest idle stretches:" in table
    assert "| idle: host overhead (Python, launches) | 0.02 | " in table


def test_a_trace_without_gpu_work_splits_the_training_threads_time():
    trace = Trace()
    for step in range(2):
        base = step * 100
        trace.host(f"ProfilerStep#{step + 1}", base, base + 100, "user_annotation")
        trace.host(WAIT_FOR_BATCH, base, base + 10, "user_annotation")
        trace.host("aten::convolution", base + 10, base + 70)
        trace.host("Optimizer.step#SGD.step", base + 70, base + 100, "user_annotation")
    report = trace.read()
    assert report.device is None
    assert report.host_causes == {
        WAITING_FOR_INPUT: pytest.approx(20),
        OPTIMIZER: pytest.approx(60),
        FORWARD_BACKWARD: pytest.approx(120),
    }
    assert report.line() == (
        "2 steps, 0.1 ms a step on the CPU: forward, backward and the loop 60%, optimizer (host "
        "side) 30%, waiting for input 10%"
    )


def test_an_epochs_evaluation_and_a_checkpoint_in_the_profile_are_named_not_counted_as_steps():
    trace = Trace()
    trace.host("ProfilerStep#1", 0, 1000, "user_annotation")
    trace.kernel("conv", 0, 0, 100)
    trace.host("checkpoint", 100, 300, "user_annotation")
    trace.host("evaluation", 300, 900, "user_annotation")
    trace.host("aten::cudnn_convolution", 400, 410)
    trace.kernel("conv_eval", 405, 410, 500)
    trace.kernel("conv", 950, 950, 1000)
    report = trace.read()
    assert report.idle[SAVING] == pytest.approx(200)
    assert report.idle[EVALUATING] == pytest.approx(105 + 400)  # to each next launch
    assert report.idle[HOST_OVERHEAD] == pytest.approx(5 + 50)
    kinds = {group.kind for group in report.kernels}
    assert "between steps (evaluation, checkpoints)" in kinds


def test_a_run_too_short_for_its_profile_says_so(tmp_path, caplog):
    from resnet50_trainer.reporting.profiling import StepProfiler

    profiler = StepProfiler(1, str(tmp_path / "run.log"), steps_in_run=2)
    assert not profiler.step()
    with caplog.at_level("WARNING"):
        assert profiler.step()  # ended with the run's last step, on every process alike
    assert not profiler.close()
    assert caplog.messages == [
        "--profile_iters 1 recorded nothing: the run took 2 steps, and a profile starts after at "
        "least one and discards its first: give the run 3 steps or more"
    ]
    assert list(tmp_path.iterdir()) == []


def test_the_window_is_the_recorded_steps_so_a_wait_before_the_first_kernel_counts():
    """Each step waits 100 µs for its batch, then runs a 100 µs kernel: busy half the time, not
    the two thirds that the first kernel to the last would say."""
    trace = Trace()
    for step in range(2):
        base = step * 200
        trace.host(f"ProfilerStep#{step + 1}", base, base + 200, "user_annotation")
        trace.host(WAIT_FOR_BATCH, base, base + 100, "user_annotation")
        trace.kernel("k", base + 100, base + 100, base + 200)
    report = trace.read()
    assert (report.gpu_window, report.busy) == (400, 200)
    assert report.idle == {WAITING_FOR_INPUT: pytest.approx(200)}


def test_collectives_and_their_kernels_are_named():
    trace = Trace()
    trace.host("ProfilerStep#1", 0, 300, "user_annotation")
    trace.kernel("k", 0, 0, 100)
    trace.host("nccl:all_reduce", 100, 200, "cpu_op", thread=AUTOGRAD)
    trace.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 200, 200, 300, thread=AUTOGRAD)
    trace.host("aten::addmm", 0, 1)
    report = trace.read()
    assert report.idle == {COLLECTIVES: pytest.approx(100)}
    kinds = {(group.kind, group.backend) for group in report.kernels}
    assert ("communication", "NCCL") in kinds


def test_a_gemm_is_cublas_and_an_implicit_gemm_convolution_is_cudnn():
    trace = Trace()
    trace.host("ProfilerStep#1", 0, 100, "user_annotation")
    trace.host("aten::addmm", 0, 5)
    trace.kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 1, 10, 20)
    trace.host("aten::convolution_backward", 20, 25)
    trace.kernel("sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwc", 21, 30, 40)
    backends = {(group.kind, group.backend) for group in trace.read().kernels}
    assert backends == {("other", "cuBLAS"), ("convolution", "cuDNN")}
