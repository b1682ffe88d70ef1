#!/usr/bin/env bash
# The `hami` section of benchmarks/gpu_enforcement.sh, ON the GPU machine: build HAMi-core
# (carried in .hami/ by benchmarks/gpu_enforcement_src.sh) with the machine's nvcc, then one
# PyTorch process under it with a 1 GiB limit allocates 64 MiB at a time, with and without
# expandable segments: where its OOM came, against the limit (the budget ± one page). Writes
# hami.json into the folder given; kills nothing (its processes end on their own).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out="${1:?usage: gpu_enforcement_hami.sh OUT}"
python="${PYTHON:-python3}"
if [ ! -d .hami ]; then echo "hami: no .hami/ carried (benchmarks/gpu_enforcement_src.sh)"; exit 0; fi
if ! command -v nvcc >/dev/null || ! command -v cmake >/dev/null; then
  echo "hami: no nvcc or cmake on this machine: not built"; exit 0
fi
build=/tmp/trialq-hami
rm -rf "$build" && cp -r .hami "$build" && (cd "$build" && bash ./build.sh >build.log 2>&1) \
  || { echo "hami: the build failed"; tail -20 "$build/build.log"; exit 1; }
mkdir -p /tmp/vgpulock
check='
import json, os, sys, torch
blocks = []
try:
    while len(blocks) < 64:
        blocks.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError as exc:
    print(json.dumps({"oom_after_mib": 64 * len(blocks), "error": str(exc)[:200]}))
    sys.exit(0)
print(json.dumps({"oom_after_mib": None, "held_mib": 64 * len(blocks)}))
'
for segments in "expandable_segments:False" "expandable_segments:True"; do
  LD_PRELOAD="$build/build/libvgpu.so" CUDA_DEVICE_MEMORY_LIMIT_0=1g \
    CUDA_DEVICE_MEMORY_SHARED_CACHE="/tmp/trialq-hami-$$.cache" PYTORCH_CUDA_ALLOC_CONF="$segments" \
    timeout 60 "$python" -c "$check" | sed "s/^/{\"alloc_conf\": \"$segments\", \"run\": /; s/$/}/"
done | tee "$out/hami.json"
