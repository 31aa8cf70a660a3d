#!/usr/bin/env bash
# Fill a wheel folder for `make gpu-check` on a GPU machine that has no network.
#
# Run this on a machine WITH network access (any OS/arch: pip downloads for the target named
# below, not for this machine). It fetches the notebook-test stack that a bare GPU image tends to
# lack (nbval, nbclient, nbformat, ipykernel, jupyter_client, ipywidgets, and the kit's rich and
# anywidget) and everything they need,
# as wheels for CPython 3.12 on manylinux x86-64. Copy the folder next to the repository (or keep
# it inside, as .gpu-wheels/, which git ignores) and run
#     make gpu-check PYTHON=python3 GPU_NOVENV=1 GPU_WHEELS=.gpu-wheels
#
# Usage: scripts/fetch_gpu_wheels.sh [DIR] [PYTHON_VERSION]   (defaults: .gpu-wheels 3.12)
# Not the bench extra (flax, optax, grain): resolved for another machine, pip pulls an older jax
# and jaxlib with them (196 MB, measured), which would shadow the GPU machine's own jax.
set -euo pipefail
dir=${1:-.gpu-wheels}
pyver=${2:-3.12}
pip=${PIP:-python3 -m pip}
mkdir -p "$dir"
# One resolution for the target platform: pip picks one version of each package, so the
# folder installs with --no-deps and no conflicts.
$pip download --quiet --dest "$dir" --only-binary=:all: \
    --python-version "$pyver" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 \
    nbval nbclient nbformat ipykernel jupyter_client ipywidgets rich anywidget
n=$(ls "$dir"/*.whl | wc -l)
size=$(du -sh "$dir" | cut -f1)
echo "$n wheels, $size in $dir"
