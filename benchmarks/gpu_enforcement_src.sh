#!/usr/bin/env bash
# Run HERE, where GitHub is reachable, before a lent GPU machine runs
# benchmarks/gpu_enforcement.sh: HAMi-core's source at the commit the worker images pin, into
# .hami/ (git-ignored), which the call to the GPU machine carries (a few MiB) for its `hami`
# section to build with the machine's nvcc.
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$(sed -n 's/^ARG HAMI_CORE_COMMIT=//p' docker/worker-torch.Dockerfile)
rm -rf .hami
git clone --quiet https://github.com/Project-HAMi/HAMi-core.git .hami
git -C .hami checkout --quiet "$commit"
rm -rf .hami/.git .hami/docs
echo "HAMi-core $commit in .hami/"
