#!/usr/bin/env bash
# Regenerate the images' lock files from pyproject.toml's ranges: every package pinned with the
# hashes of all its files on PyPI, resolved for the images' Python (3.11) on x86_64 Linux.
#
#   bash docker/lock.sh            (from anywhere; uses `uv` from PATH, else installs it in a
#                                   temporary virtualenv)
#
# worker-tf.lock   the GPU worker image (extra tf: tensorflow, on the TensorFlow base image)
# worker-cpu.lock  the CPU worker image (extra cpu: tensorflow-cpu, on python:3.11)
# worker-torch.lock  the PyTorch worker image (docker/worker-torch.in: torch with its CUDA
#                    wheels, no TensorFlow)
# worker-jax.lock  the JAX worker image (docker/worker-jax.in: jax[cuda12], no TensorFlow)
# driver.lock      the driver image (extra postgres, plus optuna-dashboard and Flower)
#
# tests/deploy/test_locks.py fails when a lock and pyproject.toml disagree.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
uv=$(command -v uv || true)
if [ -z "$uv" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m venv "$tmp/venv"
  "$tmp/venv/bin/python" -m pip install --quiet "uv==$UV_VERSION"
  uv="$tmp/venv/bin/uv"
fi

compile() {  # OUTPUT [uv pip compile arguments...]
  local output=$1 resolved
  shift
  resolved=$(mktemp)
  # Only PyPI (a machine's pip.conf may add other indexes, whose files the images cannot see).
  UV_NO_CONFIG=1 UV_INDEX_URL=https://pypi.org/simple "$uv" pip compile --quiet \
    --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
    --no-header "$@" --output-file "$resolved"
  {
    echo "# Regenerate: bash docker/lock.sh"
    echo "# ${output#docker/}: hashes for every file on PyPI; pip install --require-hashes -r."
    cat "$resolved"
  } >"$output"
  rm -f "$resolved"
}

compile docker/worker-tf.lock pyproject.toml --extra tf
compile docker/worker-cpu.lock pyproject.toml --extra cpu
compile docker/worker-torch.lock pyproject.toml docker/worker-torch.in
compile docker/worker-jax.lock pyproject.toml docker/worker-jax.in
compile docker/driver.lock pyproject.toml docker/driver-tools.in --extra postgres
