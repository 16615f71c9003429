#!/usr/bin/env bash
# Run on a lent GPU machine, from a checkout that carries wheelhouse/ (scripts/build_wheelhouse.sh;
# a lent machine holds most of it already). Installs what the machine lacks, runs
# `pytest -m gpu tests/gpu` (in 4 workers where pytest-xdist is there), then the benchmarks, most
# telling first: compute only and end to end (nvJPEG) in bfloat16, compute only in float16, end to
# end with CPU decoding on 3/4 of the cores; then where time is left `--compile` in both precisions,
# the ImageNet example's loop and DDP's cost, the input pipeline alone both ways, and CPU decoding
# on every core. Each trainer figure is steady state (200 steps inside one epoch, after 40 untimed:
# benchmarks/train.py) and comes with a profile of 8 steps before its window (--profile_iters:
# where the GPU's time went). Writes ONE markdown file, $OUT/gpu_check.md (else ./gpu_check_out/):
# the figures' table, the profiles side by side, then each profile's own table; the figures as
# benchmarks/' records in gpu_check.json (for `python -m benchmarks tables`); the traces (gzipped
# Chrome JSON) in profiles.tar; the full output in gpu_check.log. Parts that would end past
# GPU_CHECK_SECONDS (540: 9 minutes, inside a lent machine's 10-minute command, leaving room to
# rerun within its 15) are cut short or skipped, and the table says so; --no_tests leaves the
# time to the figures. On a 16-core H200 the parts before --compile should take about 7 minutes.
#   usage: scripts/gpu_check.sh [--quick] [--no_tests]      PYTHON: the interpreter (python3)
# --quick: 60 steps a figure, no profiles, no --compile.
# Exit status: 0 every part ran; 1 a part failed (the table names it); 2 bad usage or a missing
# package with no wheelhouse/; 77 no CUDA GPU here (one line: nothing to check).
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
out=${OUT:-$PWD/gpu_check_out}
steps=200 profile=8 ddp_rounds=3 compile=1 tests=1
end=$((SECONDS + ${GPU_CHECK_SECONDS:-540} - 20)) # 20 s kept for the table
for arg in "$@"; do
    case $arg in
        --quick) steps=60 profile=0 ddp_rounds=1 compile=0 ;;
        --no_tests) tests=0 ;;
        -h|--help) sed -n '2,/^set -uo pipefail/p' "$0" | sed '$d; s/^# \{0,1\}//'
                   exit 0 ;;
        *) echo "gpu_check: error: unknown argument '$arg' (usage: scripts/gpu_check.sh [--quick] [--no_tests])" >&2
           exit 2 ;;
    esac
done

if ! "$python" -c 'import torch' 2>/dev/null; then
    echo "gpu_check: error: $python cannot import torch: set PYTHON to the interpreter that has it" >&2
    exit 2
fi
if ! "$python" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    echo "gpu_check: no CUDA GPU on this machine (torch.cuda.is_available() is False): nothing to check"
    exit 77
fi

packages="lmdb plyvel redis protobuf simplejpeg psutil nvidia-ml-py matplotlib pytest"
if ! "$python" -c 'import lmdb, plyvel, redis, google.protobuf, simplejpeg, psutil, pynvml, matplotlib, pytest' 2>/dev/null; then
    if [ ! -d "$repo/wheelhouse" ]; then
        echo "gpu_check: error: packages missing and no wheelhouse/: run scripts/build_wheelhouse.sh where pip reaches the index, and carry wheelhouse" >&2
        exit 2
    fi
    # shellcheck disable=SC2086
    if ! "$python" -m pip install -q --no-index --find-links "$repo/wheelhouse" $packages; then
        echo "gpu_check: error: pip could not install wheelhouse/ (cp312 manylinux x86_64 wheels): see pip's message above" >&2
        exit 2
    fi
fi
export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# The checkout's compiled modules are built for this Python (both optional: without them the CPU
# decode path decodes whole frames and resizes with PyTorch's operator, slower than users get).
(cd "$repo" && "$python" setup.py -q build_ext --inplace >/dev/null 2>&1)
"$python" -c 'import resnet50_trainer.data.formats.jpeg_region as j, resnet50_trainer.data.transforms as t
print("compiled modules: region decoder", j.REGION_DECODE, "| resampler", t.resize_box is not None)' || true
mkdir -p "$out" || exit 2
parts=$(mktemp -d) data=$(mktemp -d)
trap 'rm -rf "$parts" "$data"' EXIT # the figures end in the table; the JPEGs are regenerated
cores=$(nproc)
exec > >(tee "$out/gpu_check.log") 2>&1

# part NAME SECONDS COMMAND...: a failure or overrun leaves NAME.failed for the table (and the exit
# status), and the rest goes on. A file, not a variable: part may run in a pipeline's subshell.
part() {
    local name=$1 limit=$2 left=$((end - SECONDS))
    shift 2
    if [ "$left" -lt 30 ]; then
        echo "GPU_CHECK_SECONDS spent" >"$parts/$name.failed"
        return
    fi
    [ "$limit" -le "$left" ] || limit=$left
    echo "== $name (at most ${limit}s, $((SECONDS))s in): $*"
    # SIGINT, not SIGTERM: the trainer takes SIGTERM for a preemption and saves before it stops.
    if ! timeout -s INT -k 15 "$limit" "$@"; then
        echo "failed or ran past ${limit}s (see gpu_check.log)" >"$parts/$name.failed"
    fi
}
train_bench() { # benchmarks/train.py, its package found on PYTHONPATH ($repo); profiled
    local name=$1 limit=$2
    shift 2
    part "$name" "$limit" "$python" -m benchmarks.train --out "$data" --steps "$steps" \
        --ddp_rounds "$ddp_rounds" --profile "$profile" --profile_dir "$parts/profiles" \
        --part "$name" --results "$parts/$name.json" "$@"
}
input_bench() { # DECODE_DEVICE: resnet50-db bench's "images/sec: N" into input_DECODE.json
    local rate
    part "input_$1" 60 "$python" -m resnet50_trainer.tools.db.bench "$data/lmdb_1024" \
        --device cuda --decode_device "$1" --num_workers "$2" --batches 20 |
        tee "$parts/input_$1.out"
    rate=$(sed -n 's/^images\/sec: //p' "$parts/input_$1.out")
    [ -z "$rate" ] || echo "{\"figures\": {\"input\": $rate}}" >"$parts/input_$1.json"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
if [ "$tests" = 1 ]; then
    # tests/gpu holds every GPU test; other folders' modules need test-only packages to collect.
    # Verbose, so a part cut short still names each test's outcome; one hung test is stopped at
    # 120 s by pytest-timeout, and the tests share the GPU in 4 workers, test by test (the two
    # files would otherwise keep two busy), where those are installed (the lent machines have both).
    per_test=$("$python" -c 'import pytest_timeout' 2>/dev/null && echo "--timeout=120")
    workers=$("$python" -c 'import xdist' 2>/dev/null && echo "-n 4 --dist load")
    # shellcheck disable=SC2086
    part pytest 210 "$python" -m pytest -v -rfEs --tb=short --durations=10 -p no:cacheprovider \
        $per_test $workers -m gpu "$repo/tests/gpu" | tee "$parts/pytest.log"
    tail -n 1 "$parts/pytest.log" | tr -d '=' | sed 's/^ *//; s/ *$//' >"$parts/pytest.txt"
    # pytest's status 5 (no test marked gpu) is no failure.
    ! grep -q "no tests ran" "$parts/pytest.txt" || rm -f "$parts/pytest.failed"
fi
# Most telling first. bf16 also builds the data (1024 JPEGs as files and as an LMDB) the rest reuse.
train_bench bf16 150 --skip baseline,ddp
train_bench fp16 75 --dtype float16 --skip baseline,end_to_end,ddp
train_bench cpu_decode 90 --cpu_decode --workers $((cores * 3 / 4)) --skip baseline,compute,ddp
if [ "$compile" = 1 ]; then
    train_bench bf16_compile 150 --compile --skip baseline,end_to_end,ddp
    train_bench fp16_compile 150 --compile --dtype float16 --skip baseline,end_to_end,ddp
fi
train_bench example 90 --skip end_to_end,compute
input_bench gpu $((cores - 1))
input_bench cpu "$cores"
train_bench cpu_decode_all 90 --cpu_decode --workers "$cores" --skip baseline,compute,ddp
status=0
"$python" "$repo/scripts/gpu_check_table.py" "$parts" "$out/gpu_check.md" || status=1
if [ -d "$parts/profiles" ]; then
    tar -C "$parts/profiles" -cf "$out/profiles.tar" . || status=1
fi
! compgen -G "$parts/*.failed" >/dev/null || status=1
echo "gpu_check: table in $out/gpu_check.md, figures in $out/gpu_check.json, traces in" \
    "$out/profiles.tar, log in $out/gpu_check.log (exit status $status, ${SECONDS}s)"
exit "$status"
