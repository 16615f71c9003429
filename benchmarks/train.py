"""Training throughput: ours against PyTorch's ImageNet example loop, and DDP's cost, in one run.

1. baseline: the ImageNet example's plain float32 loop (ImageFolder + RandomResizedCrop, ToTensor,
   Normalize; forward, loss, loss.item() and top-1 every step, zero_grad, backward, SGD step) over
   the same ImageNet-like JPEGs as files.
2. ours, end to end: `resnet50-trainer` from an LMDB of the same JPEGs (on a GPU: --dtype
   bfloat16 --enable_tensor_core, and --decode_device gpu unless --cpu_decode; on the CPU:
   float32, as the baseline).
3. ours, compute only: `resnet50-trainer --train_data null`, same flags.
4. DDP's cost: the same synthetic step loop with and without DistributedDataParallel at one
   process, alternated --ddp_rounds times; the round with the median ratio is reported.
Ours is timed in steady state: --steps steps inside one epoch, after at least --warmup untimed
ones (its console lines give the window's time); with --profile N, N steps before the window are
profiled and their table and trace kept in --profile_dir. The example loop and DDP's cost time
--baseline_steps after --warmup. Prints images/s, the ratios, GPU memory peaks and the profiles'
lines. Usage (GPU): python -m benchmarks.train
Small CPU smoke run: --num_layers 18 --image_size 64 --batch_size 16 --steps 20 --baseline_steps 4
--results PATH also writes the figures as JSON (scripts/gpu_check.sh makes its table of them).
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torchvision import datasets, models, transforms

from benchmarks import bench_data
from benchmarks.input_pipeline import photo_sets, prepare_photo_sets
from benchmarks.registry import HIGHER, Context, Figure, benchmark
from benchmarks.trees import BENCHMARKS_ROOT, MeasurementFailed, Tree

IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
THIS = Tree("this", BENCHMARKS_ROOT)


def baseline(args, device: torch.device, root: str) -> float:
    """The ImageNet example's train() loop, float32, timed after --warmup steps."""
    dataset = datasets.ImageFolder(
        root,
        transforms.Compose(
            [
                transforms.RandomResizedCrop(args.image_size),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
            ]
        ),
    )
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=args.workers,
        pin_memory=device.type == "cuda",
        drop_last=True,
        persistent_workers=True,
    )
    model = models.__dict__[f"resnet{args.num_layers}"]().to(device)
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9, weight_decay=1e-4)
    model.train()
    batches = itertools.chain.from_iterable(itertools.repeat(loader))
    for step, (images, target) in enumerate(batches):
        if step == args.warmup:
            _sync(device)
            started = time.perf_counter()
        if step == args.warmup + args.baseline_steps:
            break
        images, target = images.to(device, non_blocking=True), target.to(device, non_blocking=True)
        output = model(images)
        loss = F.cross_entropy(output, target)
        loss.item()  # the example's AverageMeter.update(loss.item(), ...)
        (output.argmax(1) == target).float().mean().item()  # its accuracy(), top-1
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    _sync(device)
    return args.baseline_steps * args.batch_size / (time.perf_counter() - started)


# The trainer's console line every PRINT_EVERY steps gives the rate since the line before; its
# divergence check reads the device this often anyway (train/epoch_loop.py), so the lines add no
# wait for the GPU.
PRINT_EVERY = 20
FINISHED = re.compile(r"Finished iteration (\d+)/\d+ of epoch \d+ \(([\d.]+) images/sec\)")


class Run(NamedTuple):
    """What one run of the trainer measured: images/s over the window, its peak GPU memory ("" on
    the CPU), and with a profile, the profile's one-line summary (its table and trace are copied
    to --profile_dir)."""

    rate: float
    peak: str
    profile: str


def untimed_steps(args) -> int:
    """Steps before the timed window: at least --warmup, and past the profile (its warm-up, the
    discarded step, the recorded ones and its writing), on a console line."""
    # Here, not at the top: a base's process imports this module (example_loop_rate), and a base
    # older than --profile_iters has no profiling module to import from.
    from resnet50_trainer.reporting.profiling import WARMUP_STEPS

    untimed = max(args.warmup, WARMUP_STEPS + 2 + args.profile if args.profile else 0)
    return -(-untimed // PRINT_EVERY) * PRINT_EVERY


def interval_rates(output: str, untimed: int) -> list[tuple[int, float]]:
    """(steps, images/s) of each interval between the trainer's console lines after the first
    `untimed` steps (each line's rate is that of the steps since the line before)."""
    intervals, previous = [], 0
    for match in FINISHED.finditer(output):
        step, rate = int(match[1]), float(match[2])
        if previous >= untimed:
            intervals.append((step - previous, rate))
        previous = step
    if not intervals:
        raise MeasurementFailed(f"no console line after step {untimed} in:\n{output[-3000:]}")
    return intervals


def steady_rate(output: str, untimed: int) -> float:
    """Images/s over the steps after the first `untimed`: the intervals' steps over their time."""
    intervals = interval_rates(output, untimed)
    return sum(steps for steps, _ in intervals) / sum(steps / rate for steps, rate in intervals)


def ours(args, device: torch.device, train_data: str, out: str, tree: Tree = THIS) -> Run:
    """Images/s of `tree`'s `resnet50-trainer` in a subprocess, over --steps steps inside one
    epoch after untimed_steps(args), and its peak GPU memory line; with args.profile, the profile
    of as many steps before the window (its table and trace copied to args.profile_dir)."""
    log_dir = tempfile.mkdtemp(dir=out, prefix="run_")
    untimed = untimed_steps(args)
    flags = [
        "--train_data",
        train_data,
        "--num_layers",
        str(args.num_layers),
        "--image_size",
        str(args.image_size),
        "--batch_size",
        str(args.batch_size),
        "--epoch_size",
        str((untimed + args.steps) * args.batch_size),
        "--num_epochs",
        "1",
        "--num_workers",
        str(args.workers),
        "--log_dir",
        log_dir,
        "--num_labels",
        "1000",
        "--print_every",
        str(PRINT_EVERY),
    ]
    if args.compile:
        flags += ["--compile"]
    if args.profile:
        flags += ["--profile_iters", str(args.profile)]
    if device.type == "cuda":
        flags += ["--dtype", args.dtype, "--enable_tensor_core"]
        if train_data != "null" and not args.cpu_decode:
            flags += ["--decode_device", "gpu"]
    else:  # float32 like the baseline: CPUs without bfloat16 units run autocast slower
        flags += ["--use_cpu"]
    print("  ours:", " ".join(flags), flush=True)
    run = subprocess.run(
        tree.trainer(flags), cwd=out, capture_output=True, text=True, env=tree.environment()
    )
    output = run.stderr + run.stdout
    if run.returncode:
        raise MeasurementFailed(
            f"resnet50-trainer failed ({run.returncode}):\n{run.stderr[-3000:]}"
        )
    peaks = [line for line in output.splitlines() if "peak GPU" in line]
    if peaks:
        print("  ", peaks[-1].strip())
    profiles = [line for line in output.splitlines() if line.startswith("Profile of")]
    if profiles:
        print("  ", profiles[-1])
        _keep_profile(log_dir, args, "compute" if train_data == "null" else "end_to_end")
    peak = peaks[-1].rsplit("peak GPU memory", 1)[-1].strip() if peaks else ""
    return Run(steady_rate(output, untimed), peak, profiles[-1] if profiles else "")


def _keep_profile(log_dir: str, args, what: str) -> None:
    """The run's profile table and trace, as PART_WHAT.profile.md and .trace.json.gz, into
    args.profile_dir."""
    from resnet50_trainer.reporting.profiling import TABLE_SUFFIX, TRACE_SUFFIX  # as above

    if not args.profile_dir:
        return
    os.makedirs(args.profile_dir, exist_ok=True)
    for suffix in (TABLE_SUFFIX, TRACE_SUFFIX):
        for found in glob.glob(os.path.join(log_dir, f"*{suffix}")):
            shutil.copy(found, os.path.join(args.profile_dir, f"{args.part}_{what}{suffix}"))


def ddp_cost(args, device: torch.device) -> tuple[float, float]:
    """(images/s without DDP, with DDP) at one process, synthetic batch: the round of median
    ratio."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group(backend, store=store, rank=0, world_size=1)
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    labels = torch.randint(0, 1000, (args.batch_size,), device=device)
    model = models.__dict__[f"resnet{args.num_layers}"]().to(device)
    wrapped = DistributedDataParallel(
        model, device_ids=[device] if device.type == "cuda" else None, gradient_as_bucket_view=True
    )
    optimizer = torch.optim.SGD(model.parameters(), 0.1, momentum=0.9)

    def rate(module) -> float:
        for step in range(args.warmup + args.baseline_steps):
            if step == args.warmup:
                _sync(device)
                started = time.perf_counter()
            loss = F.cross_entropy(module(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        _sync(device)
        return args.baseline_steps * args.batch_size / (time.perf_counter() - started)

    # Alternate so that drift (a shared machine, clocks) hits both alike; the median round wins.
    results = sorted(
        ((rate(model), rate(wrapped)) for _ in range(args.ddp_rounds)),
        key=lambda pair: pair[1] / pair[0],
    )
    dist.destroy_process_group()
    return results[len(results) // 2]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak(device: torch.device) -> str:
    if device.type != "cuda":
        return ""
    peak = torch.cuda.max_memory_allocated(device) / 2**30
    torch.cuda.reset_peak_memory_stats(device)
    return f"{peak:.2f} GiB"


class Results:
    """The figures and GPU memory peaks so far, written to --results after each part: a run cut
    short (scripts/gpu_check.sh's time limits) keeps what it measured."""

    def __init__(self, path: str | None, data: str):
        self.path, self.data = path, data
        self.figures: dict[str, float] = {}
        self.peaks: dict[str, str] = {}
        self.profiles: dict[str, str] = {}

    def add(self, name: str, figure: float, peak: str = "", profile: str = "") -> None:
        self.figures[name], self.peaks[name] = figure, peak
        if profile:
            self.profiles[name] = profile
        if self.path:
            with open(self.path, "w") as results:
                json.dump(
                    {
                        "figures": self.figures,
                        "peaks": self.peaks,
                        "profiles": self.profiles,
                        "data": self.data,
                    },
                    results,
                )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "resnet50_bench_data"))
    parser.add_argument("--images", type=int, default=1024)
    parser.add_argument("--num_layers", type=int, default=50)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200, help="ours: timed steps, in one epoch")
    parser.add_argument("--warmup", type=int, default=20, help="untimed steps before any timing")
    parser.add_argument(
        "--baseline_steps", type=int, default=30, help="timed steps of the example loop and DDP's"
    )
    parser.add_argument(
        "--profile", type=int, default=0, help="ours: profile this many steps before the window"
    )
    parser.add_argument("--profile_dir", help="where the profiles' tables and traces are kept")
    parser.add_argument("--part", default="train", help="the profiles' names: PART_compute...")
    parser.add_argument("--workers", type=int, default=min(8, (os.cpu_count() or 2) - 1))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--ddp_rounds", type=int, default=5, help="alternations without/with DDP")
    parser.add_argument("--cpu_decode", action="store_true", help="ours decodes on the CPU")
    parser.add_argument("--compile", action="store_true", help="ours runs with --compile")
    parser.add_argument("--results", help="also write the figures to this JSON file")
    parser.add_argument(
        "--skip", default="", help="comma-separated parts to skip: baseline,end_to_end,compute,ddp"
    )
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    skip = set(filter(None, args.skip.split(",")))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True
    root, lmdb_path = bench_data.build(args.out, args.images)
    print(
        f"device {torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}; "
        f"{os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}; "
        f"data {bench_data.describe(root)}; "
        f"ResNet-{args.num_layers}, {args.image_size} px, batch {args.batch_size}",
        flush=True,
    )
    results = Results(args.results, bench_data.describe(root))
    figures = results.figures
    if "baseline" not in skip:
        results.add("baseline", baseline(args, device, root), _peak(device))
        print(
            f"baseline (ImageNet example, float32): {figures['baseline']:.1f} images/s"
            f"{', peak GPU memory ' * bool(results.peaks['baseline'])}{results.peaks['baseline']}",
            flush=True,
        )
    if "compute" not in skip:
        results.add("compute", *ours(args, device, "null", args.out))
        print(
            f"ours compute only (--train_data null): {figures['compute']:.1f} images/s", flush=True
        )
    if "end_to_end" not in skip:
        results.add("end_to_end", *ours(args, device, lmdb_path, args.out))
        print(f"ours end to end: {figures['end_to_end']:.1f} images/s", flush=True)
    if {"baseline", "end_to_end"} <= figures.keys():
        print(
            f"ratio ours end to end / baseline: {figures['end_to_end'] / figures['baseline']:.2f}x"
        )
    if {"compute", "end_to_end"} <= figures.keys():
        print(f"end to end / compute only: {figures['end_to_end'] / figures['compute']:.1%}")
    if "ddp" not in skip:
        plain, wrapped = ddp_cost(args, device)
        results.add("without_ddp", plain)
        results.add("with_ddp", wrapped)
        print(
            f"DDP at one process ({device.type}, float32): without {plain:.1f}, "
            f"with {wrapped:.1f} images/s, cost {1 - wrapped / plain:.1%}"
        )


if __name__ == "__main__":
    main()


# The CPU figure: ResNet-18 at 64 px, batch 16, one input process each side (2 cores here).
CPU_RUN = argparse.Namespace(
    num_layers=18,
    image_size=64,
    batch_size=16,
    steps=20,
    baseline_steps=20,
    warmup=2,
    workers=1,
    compile=False,
    profile=0,
)
# The GPU figures: ResNet-50 at 224 px, batch 256, bfloat16 (scripts/gpu_check.sh's parts).
GPU_RUN = argparse.Namespace(
    num_layers=50,
    image_size=224,
    batch_size=256,
    steps=200,
    baseline_steps=30,
    warmup=20,
    workers=min(15, (os.cpu_count() or 2) - 1),
    compile=False,
    dtype="bfloat16",
    cpu_decode=False,
    profile=0,
)


def example_loop_rate(root: str, device: str) -> float:
    """Images/s of the ImageNet example's loop over `root`'s files (runs in a tree's process)."""
    run = GPU_RUN if device == "cuda" else CPU_RUN
    if device == "cuda":
        torch.backends.cudnn.benchmark = True
    return baseline(run, torch.device(device), root)


@benchmark(
    "train",
    "Training, CPU",
    (
        Figure(
            "train_vs_example_loop",
            "x",
            HIGHER,
            1.0,
            0.25,
            "end-to-end CPU training, `resnet50-trainer` from the photographs' LMDB (images/s "
            "of its steps after the first 20, in one epoch), against the loop PyTorch's ImageNet "
            "example writes over the same JPEGs as files; ResNet-18, 64 px, batch 16, float32, "
            "one input process each",
            quick=True,
        ),
        Figure("train_cpu_images_s", "images/s", HIGHER, None, 0.25, "ours, as above"),
        Figure("train_example_cpu_images_s", "images/s", HIGHER, None, 0.25, "the example loop"),
    ),
    prepare=prepare_photo_sets,
    rounds=(2, 3),
    order=50,
)
def measure_train(context: Context, tree: Tree) -> dict[str, float]:
    sets = photo_sets(context)
    example = float(
        tree.call("benchmarks.train:example_loop_rate", root=sets["files"], device="cpu")
    )
    with tempfile.TemporaryDirectory(dir=context.scratch) as out:
        rate = ours(CPU_RUN, torch.device("cpu"), sets["lmdb"], out, tree).rate
    return {
        "train_vs_example_loop": rate / example,
        "train_cpu_images_s": rate,
        "train_example_cpu_images_s": example,
    }


def gpu_figure(name: str, unit: str, goal: float | None, doc: str) -> Figure:
    return Figure(name, unit, HIGHER, goal, 0.1, doc)


def no_gpu() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return "needs a CUDA GPU (scripts/gpu_check.sh measures these on a lent one)"
    return None


@benchmark(
    "gpu",
    "Training, GPU (ResNet-50, 224 px, batch 256)",
    (
        gpu_figure(
            "gpu_compute_bf16_images_s",
            "images/s",
            3000.0,
            "`--train_data null` (compute only), bfloat16, `--enable_tensor_core`, channels_last",
        ),
        gpu_figure("gpu_compute_fp16_images_s", "images/s", None, "the same in float16"),
        gpu_figure("gpu_compute_bf16_compile_images_s", "images/s", None, "bfloat16, `--compile`"),
        gpu_figure("gpu_compute_fp16_compile_images_s", "images/s", None, "float16, `--compile`"),
        gpu_figure(
            "gpu_end_to_end_images_s",
            "images/s",
            None,
            "end to end from the LMDB, `--decode_device gpu` (nvJPEG), bfloat16",
        ),
        gpu_figure(
            "gpu_end_to_end_cpu_decode_images_s",
            "images/s",
            None,
            "end to end, CPU decoding on 3/4 of the cores, bfloat16",
        ),
        gpu_figure("gpu_input_nvjpeg_images_s", "images/s", None, "`resnet50-db bench`, nvJPEG"),
        gpu_figure(
            "gpu_input_cpu_decode_images_s", "images/s", None, "`resnet50-db bench`, CPU decode"
        ),
        gpu_figure(
            "gpu_example_loop_images_s",
            "images/s",
            None,
            "PyTorch's ImageNet example loop, float32, ImageFolder",
        ),
        gpu_figure(
            "gpu_end_to_end_vs_compute",
            "x",
            0.95,
            "end to end (nvJPEG) over compute only, bfloat16: what the input costs",
        ),
        gpu_figure(
            "gpu_vs_example_loop",
            "x",
            3.0,
            "end to end (nvJPEG, bfloat16) over the ImageNet example's float32 loop",
        ),
    ),
    prepare=prepare_photo_sets,
    unavailable=no_gpu,
    rounds=(1, 2),
    order=50,
)
def measure_gpu(context: Context, tree: Tree) -> dict[str, float]:
    """The headline GPU figures; scripts/gpu_check.sh measures the rest of the declared ones."""
    sets = photo_sets(context)
    device = torch.device("cuda")
    example = float(
        tree.call("benchmarks.train:example_loop_rate", root=sets["files"], device="cuda")
    )
    with tempfile.TemporaryDirectory(dir=context.scratch) as out:
        compute = ours(GPU_RUN, device, "null", out, tree).rate
        end_to_end = ours(GPU_RUN, device, sets["lmdb"], out, tree).rate
    return {
        "gpu_compute_bf16_images_s": compute,
        "gpu_end_to_end_images_s": end_to_end,
        "gpu_example_loop_images_s": example,
        "gpu_end_to_end_vs_compute": end_to_end / compute,
        "gpu_vs_example_loop": end_to_end / example,
    }
