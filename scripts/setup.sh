#!/usr/bin/env bash
# Set up a fresh machine: the system packages the tests run (redis-server, Open MPI's mpirun), a
# virtual environment in .venv with the pinned torch/torchvision pair and this package installed
# editable (its C modules built in place).
set -euo pipefail
cd "$(dirname "$0")/.."

# redis-server, mpirun and a one-machine Slurm (with munge) for the multi-machine tests; a C
# compiler and libjpeg's headers for the region-of-interest JPEG decoder and the resampler that
# setup.py builds (optional: without them, whole frames are decoded and PyTorch resizes).
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v mpirun >/dev/null 2>&1 || missing+=(openmpi-bin)
command -v slurmctld >/dev/null 2>&1 || missing+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || missing+=(slurmd)
command -v sbatch >/dev/null 2>&1 || missing+=(slurm-client)
command -v munged >/dev/null 2>&1 || missing+=(munge)
command -v gcc >/dev/null 2>&1 || missing+=(gcc)
[ -f /usr/include/jpeglib.h ] || missing+=(libjpeg-dev)
command -v cjpeg >/dev/null 2>&1 || missing+=(libjpeg-turbo-progs)  # the tests' unusual JPEGs
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    elif command -v sudo >/dev/null 2>&1; then
        sudo apt-get update -qq \
            && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "setup: ${missing[*]} missing and cannot be installed without root; the Redis and" \
            "mpirun and Slurm tests fail or skip without them, and JPEGs are decoded whole without the" \
            "compiler and headers" >&2
    fi
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# constraints.txt pins a matching torch/torchvision pair; pyproject keeps the supported range wide.
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[test]"
echo "setup: ready (.venv)"
