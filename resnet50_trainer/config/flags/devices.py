"""The flags of where a run trains: its devices (GPUs, CPU processes, precision and layout on them,
compile, the model-parallel split). Checked in checks.py. Part of the one parser (parser.py)."""

from __future__ import annotations

from resnet50_trainer.config.flags.declare import FlagGroup, flag, flag_group
from resnet50_trainer.config.values import (
    Number,
    Switch,
    gpu_list,
)


@flag_group
class DeviceFlags(FlagGroup):
    TITLE = "devices"

    # the GPU ids this machine trains on; empty with use_cpu
    gpus: tuple[int, ...] = flag(type=gpu_list)
    """comma-separated GPU ids, e.g. 0,1; or all (Caffe's --gpu all). A GPU listed twice (0,0)
    gets two training processes, which all-reduce over Gloo: the multi-process path on one GPU"""
    # GPUs, or CPU workers with use_cpu: the field says what it is, the flag keeps the original's
    # name.
    processes_per_machine: int = flag(name="num_gpus", metavar="NUM_GPUS", type=Number(int, 1, 256))
    """number of GPUs (instead of --gpus); with --use_cpu, the number of CPU training processes
    (default: 1)"""
    use_cpu: bool = flag(action=Switch)
    """train on CPU (Gloo)"""
    model_parallel: bool = flag(action=Switch)
    """split each model replica over 2 GPUs (so 2 x --num_gpus devices)"""
    dtype: str = flag(if_absent="float", choices=("float", "float16", "bfloat16"))
    """training precision: float16 uses autocast and a gradient scaler (GPU only), bfloat16 autocast
    alone (GPU or CPU); weights stay float32"""
    float16_compute: bool = flag(action=Switch)
    """fp16 arithmetic in conv and fc (GPU only): under autocast this is the same mode as --dtype
    float16"""
    enable_tensor_core: bool = flag(action=Switch)
    """tensor-core maths for conv and fc (GPU only): TF32 in matmuls and convolutions, and
    channels_last tensors"""
    compile: bool = flag(action=Switch)
    """compile the training model with torch.compile (the first steps take minutes; needs a C++
    compiler on the CPU)"""
    pipeline_chunks: int = flag(type=Number(int, 1, 1024), if_absent=1)
    """with --model_parallel: micro-batches per step, so both GPUs of a pair work at once"""
    # None: cuDNN's own workspace choice
    cudnn_workspace_limit_mb: int | None = flag(type=Number(int, 1, 1 << 20))
    """cap on cuDNN's convolution workspace, in MiB (GPU only; the original capped it at 64).
    PyTorch has no setting for it; this sets CUDNN_CONV_WSCAP_DBG, which cuDNN itself reads (listed
    in PyTorch's CUDA environment variables), unless that variable is already set (default: no
    cap)"""
