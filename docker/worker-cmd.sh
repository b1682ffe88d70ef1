#!/bin/sh
# The worker images' command (their CMD): one `trialq worker` for all of the GPUs this
# container or pod was given, with its queue, GPUs and trial slots read from the environment
# (compose.yaml passes them from .env; docker/README.md, "GPUs and trial slots"):
#   TRIALQ_QUEUE           the queue it consumes (default gpu)
#   TRIALQ_GPUS            all | 0,1 | GPU-<uuid>,MIG-<uuid>,... ; empty: no GPU, a CPU worker
#   TRIALQ_TRIALS_PER_GPU  trial slots on each GPU (default 1)
#   TRIALQ_GPU_MEMORY_MB   each trial's GPU memory budget; empty: the card less a CUDA context
#                          reserve, shared among its slots
#   TRIALQ_CONCURRENCY     trial slots of a CPU worker (default 1)
# Every trial runs in a fresh process (--max-tasks-per-child 1), whose exit returns all of its
# GPU and host memory. `exec`: trialq gets the signals (SIGTERM: Celery's warm shutdown).
set -eu
if [ -n "${TRIALQ_GPUS:-}" ]; then
  set -- --gpus "$TRIALQ_GPUS" --trials-per-gpu "${TRIALQ_TRIALS_PER_GPU:-1}"
  if [ -n "${TRIALQ_GPU_MEMORY_MB:-}" ]; then
    set -- "$@" --gpu-memory-mb "$TRIALQ_GPU_MEMORY_MB"
  fi
else
  set -- --concurrency "${TRIALQ_CONCURRENCY:-1}"
fi
# An empty variable (Compose passes one for a setting left empty in .env) is no setting at all:
# trialq's settings would read "" as a value.
for name in TRIALQ_GPUS TRIALQ_TRIALS_PER_GPU TRIALQ_GPU_MEMORY_MB TRIALQ_CONCURRENCY \
  TRIALQ_GPU_INTERPOSER; do
  eval "value=\${$name:-}"
  [ -n "$value" ] || unset "$name"
done
# The allocation interposer, where asked for and no MPS daemon serves the GPUs (a pinned limit
# or a pipe folder says one does): preloaded into the worker, so every trial it forks has it.
if [ -n "${TRIALQ_GPU_INTERPOSER:-}" ]; then
  if [ -n "${CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:-}${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then
    unset TRIALQ_GPU_INTERPOSER
  else
    export LD_PRELOAD="$TRIALQ_GPU_INTERPOSER${LD_PRELOAD:+:$LD_PRELOAD}"
  fi
fi
exec trialq worker --queue "${TRIALQ_QUEUE:-gpu}" "$@" --max-tasks-per-child 1
