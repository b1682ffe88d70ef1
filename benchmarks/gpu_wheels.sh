#!/usr/bin/env bash
# Run HERE, on a machine with pip and a package index, before a lent GPU machine runs
# benchmarks/gpu_machine.sh: the wheels of trialq's own (non-framework) dependencies, for
# CPython 3.12 on x86-64 Linux, into .whl/ (git-ignored), which the call to the GPU machine
# carries; and Keras 3 with the two small packages of its own that the image lacks (namex,
# optree), for benchmarks/gpu.py's Keras-on-torch and Keras-on-jax trials. That machine has
# PyTorch, JAX, Lightning and torchvision with CUDA, nvidia-ml-py, pytest, h5py, ml-dtypes,
# absl-py and the scientific stack, no TensorFlow, and no package index.
#
#   bash benchmarks/gpu_wheels.sh        # then carry .whl/ (about 20 MiB; 64 MiB a call at most)
#
# The requirements are read from pyproject.toml (the dependencies, and Keras from the `cpu`
# extra), so the wheels follow it. The packages the GPU machine's image already has are left
# out: carried, they would shadow its own versions.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=.whl
IMAGE_HAS=(numpy psutil pyyaml packaging setuptools click six typing_extensions tqdm
           markupsafe python_dateutil rich pygments markdown_it_py mdurl h5py ml_dtypes absl_py)
PLATFORMS=(manylinux_2_39_x86_64 manylinux_2_35_x86_64 manylinux_2_34_x86_64 manylinux_2_31_x86_64
           manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64
           manylinux2014_x86_64 manylinux2010_x86_64 manylinux1_x86_64)

mapfile -t requirements < <(python3 -c '
import tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
for requirement in project["dependencies"]:
    print(requirement)
for requirement in project["optional-dependencies"]["cpu"]:
    if requirement.startswith("keras"):
        print(requirement)
')

rm -rf "$WHEELS"
mkdir -p "$WHEELS"
python3 -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
  --python-version 3.12 --implementation cp "${PLATFORMS[@]/#/--platform=}" \
  --dest "$WHEELS" "${requirements[@]}"
for name in "${IMAGE_HAS[@]}"; do
  rm -f "$WHEELS/$name"-[0-9]*.whl
done

# One version of each package: two would stop the install there.
duplicates=$(find "$WHEELS" -type f -name '*.whl' -printf '%f\n' | cut -d- -f1 | tr '[:upper:]' '[:lower:]' \
  | sort | uniq -d)
if [ -n "$duplicates" ]; then
  echo "gpu_wheels: two versions of: $duplicates" >&2
  exit 1
fi
size=$(du -sm "$WHEELS" | cut -f1)
if [ "$size" -gt 60 ]; then
  echo "gpu_wheels: $size MiB of wheels, over what one call carries beside the tree" >&2
  exit 1
fi
echo "gpu_wheels: $(find "$WHEELS" -type f -name '*.whl' | wc -l) wheels, $size MiB in $WHEELS/"
