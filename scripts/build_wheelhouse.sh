#!/usr/bin/env bash
# Run HERE (a machine that reaches the package index): download into wheelhouse/ the cp312
# manylinux wheels of what a lent GPU machine (Python 3.12, no network; torch, torchvision,
# pillow, tqdm and numpy preinstalled) lacks to run this package and its tests. Then pass
# `carry: ["wheelhouse"]` to the device run and start scripts/gpu_check.sh there.
#   usage: scripts/build_wheelhouse.sh [DEST]   (default: wheelhouse/ at the repository root)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dest=${1:-$repo/wheelhouse}

# The runtime dependencies of pyproject.toml that the lent machine's torch, torchvision, pillow,
# tqdm and numpy do not cover (tests/system/test_gpu_kit.py checks this list against
# pyproject), then matplotlib's own dependencies but numpy and pillow (and tensorboard's), then
# pytest's.
RUNTIME="lmdb plyvel redis protobuf simplejpeg psutil nvidia-ml-py matplotlib tensorboard"
MATPLOTLIB_DEPS="contourpy cycler fonttools kiwisolver packaging pyparsing python-dateutil six tzdata"
TENSORBOARD_DEPS="absl-py grpcio markdown tensorboard-data-server werkzeug markupsafe setuptools typing-extensions"
TEST_DEPS="pytest iniconfig pluggy pygments"
# Left out on purpose: they are on the lent machine, and a second copy of torch would not fit
# in what a device run carries.
PREINSTALLED="torch torchvision pillow tqdm numpy"

mkdir -p "$dest"
# --no-deps: pip would otherwise pull numpy (and so on) in; the lists above name every need,
# and the closure check below says if a new release added one.
# shellcheck disable=SC2086
python3 -m pip download -qq --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 --platform any \
    -c "$repo/constraints.txt" --dest "$dest" $RUNTIME $MATPLOTLIB_DEPS $TENSORBOARD_DEPS $TEST_DEPS

# Every wheel's unconditional needs (on Linux, Python 3.12) are in the wheelhouse or preinstalled.
python3 - "$dest" $PREINSTALLED <<'EOF'
import re, sys, zipfile
from pathlib import Path
from pip._vendor.packaging.requirements import Requirement

def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()

dest, preinstalled = Path(sys.argv[1]), {canonical(n) for n in sys.argv[2:]}
wheels = sorted(dest.glob("*.whl"))
have = {canonical(w.name.split("-")[0]) for w in wheels} | preinstalled
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
missing = set()
for wheel in wheels:
    with zipfile.ZipFile(wheel) as archive:
        # The wheel's own METADATA: setuptools vendors other packages' dist-info folders.
        [meta] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        lines = archive.read(meta).decode().splitlines()
    for line in lines:
        if line.startswith("Requires-Dist:"):
            need = Requirement(line.split(":", 1)[1].strip())
            if (need.marker is None or need.marker.evaluate(env)) and canonical(need.name) not in have:
                missing.add(f"{need.name} (needed by {wheel.name})")
if missing:
    sys.exit("build_wheelhouse: add to the lists: " + ", ".join(sorted(missing)))
print(f"build_wheelhouse: {len(wheels)} wheels in {dest}")
EOF
