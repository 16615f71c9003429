#!/usr/bin/env bash
# Set up a fresh machine: redis-server (for the multi-machine tests), a virtual environment in .venv
# with the pinned torch/torchvision pair and this package installed editable.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
    elif command -v sudo >/dev/null 2>&1; then
        sudo apt-get update -qq && sudo apt-get install -y -qq redis-server >/dev/null
    else
        echo "setup: redis-server is missing and cannot be installed without root; the Redis tests will fail" >&2
    fi
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
# constraints.txt pins a matching torch/torchvision pair; pyproject keeps the supported range wide.
.venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e ".[test]"
echo "setup: ready (.venv)"
