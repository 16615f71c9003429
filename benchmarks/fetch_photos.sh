#!/usr/bin/env bash
# Eight real photographs for the input benchmarks (benchmarks/bench_data.py --photos): the colour
# photos that the scikit-image and scikit-learn wheels carry as sample data (astronaut, cat, coffee,
# two motorcycles, rocket, china, flower; public domain or CC, see those projects), taken out of
# the wheels without installing them (needs pip's access to PyPI, and unzip).
# Usage: bash benchmarks/fetch_photos.sh DIR
set -euo pipefail
out=${1:?usage: fetch_photos.sh DIR}
mkdir -p "$out"
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    -d "$wheels" scikit-image==0.26.0 scikit-learn==1.9.1
unzip -o -j -q "$wheels"/scikit_image-*.whl -d "$out" \
    skimage/data/astronaut.png skimage/data/chelsea.png skimage/data/coffee.png \
    skimage/data/motorcycle_left.png skimage/data/motorcycle_right.png skimage/data/rocket.jpg
unzip -o -j -q "$wheels"/scikit_learn-*.whl -d "$out" \
    sklearn/datasets/images/china.jpg sklearn/datasets/images/flower.jpg
ls "$out"
