#!/usr/bin/env bash
# Fill .whl/ with the wheels benchmarks/gpu_check.sh installs on a GPU machine that has Python 3.12, torch,
# transformers, accelerate and peft, but neither TRL nor datasets, and no network (`make gpu-wheels`).
#
#   bash benchmarks/gpu_wheels.sh                # into .whl/ (git-ignored), for CPython 3.12 on x86-64 Linux
#   WHEELS=/some/dir PYTHON_VERSION=3.11 bash benchmarks/gpu_wheels.sh
#
# Pure-Python wheels at the versions this checkout's .venv runs (TRL, datasets, dill, multiprocess), and the three
# compiled libraries TRL imports that a bare PyTorch image usually lacks (pyarrow, pandas, xxhash), built for the
# target Python. gpu_check.sh installs each one only where the GPU machine cannot import it already. pyarrow is pinned
# to the oldest release datasets accepts: the folder travels with the working tree, which the device tool caps at
# 64 MiB, and newer pyarrow wheels alone are 55 MB. Everything comes from the package index pip is configured with;
# where it cannot be reached, copy the same files into the folder by hand (the list is printed at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
WHEELS=${WHEELS:-.whl}
PYTHON_VERSION=${PYTHON_VERSION:-3.12}
PLATFORM=${PLATFORM:-manylinux_2_28_x86_64}
PYARROW_VERSION=${PYARROW_VERSION:-24.0.0}
ABI="cp${PYTHON_VERSION/./}"

installed() { "$PYTHON" -c "from importlib.metadata import version; print(version('$1'))"; }

mkdir -p "$WHEELS"
rm -f "$WHEELS"/*.whl
pure=()
for package in trl datasets dill multiprocess; do
    pure+=("$package==$(installed "$package")")
done
binary=("pyarrow==$PYARROW_VERSION" "pandas==$(installed pandas)" "xxhash==$(installed xxhash)")
target=(--python-version "$PYTHON_VERSION" --implementation cp --abi "$ABI" --only-binary=:all:)
"$PYTHON" -m pip download --quiet --no-deps --dest "$WHEELS" "${target[@]}" --platform any "${pure[@]}"
"$PYTHON" -m pip download --quiet --no-deps --dest "$WHEELS" "${target[@]}" \
    --platform "$PLATFORM" --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 "${binary[@]}"
ls -1 "$WHEELS"
du -sh "$WHEELS"
