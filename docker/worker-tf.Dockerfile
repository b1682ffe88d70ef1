# syntax=docker/dockerfile:1
#
# trialq worker for TensorFlow: one worker for all of a host's (or a pod's) GPUs, several trial
# slots on each, one OS process per trial. PyTorch and JAX have images of their own
# (worker-torch.Dockerfile, worker-jax.Dockerfile); docker/README.md says which to pick.
# Build from the repository root (compose.yaml does this for you):
#   docker build -f docker/worker-tf.Dockerfile -t trialq-worker-tf:0.1.0 .
# CPU variant for machines without a GPU (what compose.cpu.yaml builds):
#   docker build -f docker/worker-tf.Dockerfile -t trialq-worker-cpu:0.1.0 \
#     --build-arg BASE_IMAGE=python:3.11.13-slim-bookworm --build-arg TRIALQ_EXTRA=cpu \
#     --build-arg TRIALQ_GPUS= .

# The official TensorFlow GPU image: CUDA and cuDNN user-space libraries matched to this
# TensorFlow; the driver itself comes from the host through the NVIDIA container toolkit.
ARG BASE_IMAGE=tensorflow/tensorflow:2.21.0-gpu
FROM ${BASE_IMAGE}

# Which lock to install: "tf" (docker/worker-tf.lock) on the TensorFlow base, where pip finds
# TensorFlow already there and keeps it; "cpu" (docker/worker-cpu.lock) on a plain Python base,
# which brings tensorflow-cpu instead.
ARG TRIALQ_EXTRA=tf

LABEL org.opencontainers.image.title="trialq-worker" \
      org.opencontainers.image.description="trialq worker for TensorFlow: GPU trial slots, one trial per OS process" \
      org.opencontainers.image.licenses="Apache-2.0"

# PIP_BREAK_SYSTEM_PACKAGES: the base image's Python is the container's only Python; a
# virtualenv on top would hide the TensorFlow the base image ships (and its CUDA libraries).
# TRIALQ_PRELOAD: the worker's parent imports TensorFlow once and forks every trial with it
# loaded (never initialised: CUDA does not survive fork). CUDA_DEVICE_ORDER: GPU indices as
# nvidia-smi numbers them (CUDA's own order puts the fastest first).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1 \
    TF_FORCE_GPU_ALLOW_GROWTH=true \
    TF_CPP_MIN_LOG_LEVEL=1 \
    TRIALQ_PRELOAD=tensorflow \
    CUDA_DEVICE_ORDER=PCI_BUS_ID

# 1) Dependencies, exactly as locked (docker/lock.sh makes the lock from pyproject.toml's
#    ranges): every package pinned and checked against its hash. This layer (and TensorFlow)
#    stays cached while only the code under src/ changes.
COPY docker/worker-${TRIALQ_EXTRA}.lock /tmp/trialq-build/requirements.lock
RUN python3 -m pip install --no-cache-dir --require-hashes -r /tmp/trialq-build/requirements.lock

# 2) The package itself, without touching the dependencies installed above.
COPY pyproject.toml README.md /tmp/trialq-build/
COPY src/ /tmp/trialq-build/src/
RUN python3 -m pip install --no-cache-dir --no-deps /tmp/trialq-build \
    && rm -rf /tmp/trialq-build
# The command below: `trialq worker` with its GPUs and slots from the environment.
COPY docker/worker-cmd.sh /usr/local/bin/trialq-worker-cmd

# A non-root user with a home for Keras' cache (~/.keras). No fixed UID 1000: some bases
# already have a user there.
RUN useradd --create-home --uid 10001 --user-group --shell /usr/sbin/nologin trialq
# Mount points of the shared checkpoint and artifact volumes, owned by the worker's user: a
# fresh named volume takes its owner from the image's folder (compose.yaml).
RUN mkdir -p /var/lib/trialq/checkpoints /var/lib/trialq/artifacts \
    && chown -R 10001:10001 /var/lib/trialq
USER 10001:10001
WORKDIR /home/trialq

# Healthy while this worker's heartbeat reaches Redis (TTL 20 s by default): the worker touches
# the file after each beat that did, and a shell reads its age, cheap enough for every 5 s.
ENV TRIALQ_HEARTBEAT_FILE=/tmp/trialq-heartbeat
HEALTHCHECK --interval=5s --timeout=2s --start-period=120s --retries=3 \
    CMD ["sh", "-c", "test $(( $(date +%s) - $(stat -c %Y /tmp/trialq-heartbeat) )) -lt 20"]

# The GPUs the worker takes unless told otherwise (docker/worker-cmd.sh): all that the
# container was given (Compose's device reservation, the pod's nvidia.com/gpu); empty (the CPU
# variant): none. Set last, so the layers above are the same for both.
ARG TRIALQ_GPUS=all
ENV TRIALQ_GPUS=${TRIALQ_GPUS}

# No ENTRYPOINT from the base image: the command below is the whole command line.
ENTRYPOINT []
# `trialq worker --queue $TRIALQ_QUEUE --gpus $TRIALQ_GPUS --trials-per-gpu
# $TRIALQ_TRIALS_PER_GPU [--gpu-memory-mb $TRIALQ_GPU_MEMORY_MB] --max-tasks-per-child 1`:
# every GPU the container was given, N trial slots on each, every trial in a fresh process.
CMD ["trialq-worker-cmd"]
