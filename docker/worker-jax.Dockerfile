# syntax=docker/dockerfile:1
#
# trialq worker for JAX: one worker for all of a host's (or a pod's) GPUs, several trial
# slots on each, one OS process per trial. No TensorFlow (worker-tf.Dockerfile has it).
# Build from the repository root (compose.yaml does this with TRIALQ_FRAMEWORK=jax in .env):
#   docker build -f docker/worker-jax.Dockerfile -t trialq-worker-jax:0.1.0 .

# A slim Python: jax[cuda12] brings its CUDA plugin and the CUDA 12 libraries as nvidia-* wheels
# from PyPI (NVIDIA driver 525 or newer on the host), so no CUDA base image is needed; the
# driver itself comes from the host through the NVIDIA container toolkit.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
FROM ${PYTHON_IMAGE}

LABEL org.opencontainers.image.title="trialq-worker-jax" \
      org.opencontainers.image.description="trialq worker for JAX: GPU trial slots, one trial per OS process" \
      org.opencontainers.image.licenses="Apache-2.0"

# TRIALQ_PRELOAD: the worker's parent imports jax once and forks every trial with it loaded
# (importing starts no backend; CUDA does not survive fork). XLA_PYTHON_CLIENT_PREALLOCATE:
# JAX takes 75 % of the card at its first op by default, so two trials could never share a
# GPU; the trial's own cap (its slot's budget) is set by trialq in the trial's process.
# CUDA_DEVICE_ORDER: GPU indices as nvidia-smi numbers them.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TRIALQ_PRELOAD=jax \
    XLA_PYTHON_CLIENT_PREALLOCATE=false \
    CUDA_DEVICE_ORDER=PCI_BUS_ID

# 1) Dependencies, exactly as locked (docker/lock.sh, from pyproject.toml's core and
#    docker/worker-jax.in): every package pinned and checked against its hash. This layer
#    (and JAX with its CUDA wheels) stays cached while only the code under src/ changes.
COPY docker/worker-jax.lock /tmp/trialq-build/requirements.lock
RUN python3 -m pip install --no-cache-dir --require-hashes -r /tmp/trialq-build/requirements.lock

# 2) The package itself, without touching the dependencies installed above.
COPY pyproject.toml README.md /tmp/trialq-build/
COPY src/ /tmp/trialq-build/src/
RUN python3 -m pip install --no-cache-dir --no-deps /tmp/trialq-build \
    && rm -rf /tmp/trialq-build
# The command below: `trialq worker` with its GPUs and slots from the environment.
COPY docker/worker-cmd.sh /usr/local/bin/trialq-worker-cmd

# A non-root user with a home for the caches JAX writes (~/.cache: its compilation cache).
# No fixed UID 1000: some bases already have a user there.
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
# container was given (Compose's device reservation, the pod's nvidia.com/gpu).
ARG TRIALQ_GPUS=all
ENV TRIALQ_GPUS=${TRIALQ_GPUS}

ENTRYPOINT []
# `trialq worker --queue $TRIALQ_QUEUE --gpus $TRIALQ_GPUS --trials-per-gpu
# $TRIALQ_TRIALS_PER_GPU [--gpu-memory-mb $TRIALQ_GPU_MEMORY_MB] --max-tasks-per-child 1`:
# every GPU the container was given, N trial slots on each, every trial in a fresh process.
CMD ["trialq-worker-cmd"]
