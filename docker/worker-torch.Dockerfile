# syntax=docker/dockerfile:1
#
# trialq worker for PyTorch: one worker for all of a host's (or a pod's) GPUs, several trial
# slots on each, one OS process per trial. No TensorFlow (worker-tf.Dockerfile has it).
# Build from the repository root (compose.yaml does this with TRIALQ_FRAMEWORK=torch in .env):
#   docker build -f docker/worker-torch.Dockerfile -t trialq-worker-torch:0.1.0 .

# A slim Python: PyTorch's Linux wheel on PyPI brings its own CUDA libraries (nvidia-* wheels,
# CUDA 13 for torch 2.13: NVIDIA driver 580 or newer on the host), so no CUDA base image is
# needed; the driver itself comes from the host through the NVIDIA container toolkit.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
FROM ${PYTHON_IMAGE}

LABEL org.opencontainers.image.title="trialq-worker-torch" \
      org.opencontainers.image.description="trialq worker for PyTorch: GPU trial slots, one trial per OS process" \
      org.opencontainers.image.licenses="Apache-2.0"

# TRIALQ_PRELOAD: the worker's parent imports torch and torch._dynamo once and forks every
# trial with them loaded (never initialised: CUDA does not survive fork). torch alone still
# leaves a trial 0.7 s of imports: its first optimizer.step() pulls in torch._dynamo and some
# 300 modules more (issue 27). CUDA_DEVICE_ORDER: GPU indices as nvidia-smi numbers them.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TRIALQ_PRELOAD=torch,torch._dynamo \
    CUDA_DEVICE_ORDER=PCI_BUS_ID

# 1) Dependencies, exactly as locked (docker/lock.sh, from pyproject.toml's core and
#    docker/worker-torch.in): every package pinned and checked against its hash. This layer
#    (and PyTorch with its CUDA wheels) stays cached while only the code under src/ changes.
COPY docker/worker-torch.lock /tmp/trialq-build/requirements.lock
RUN python3 -m pip install --no-cache-dir --require-hashes -r /tmp/trialq-build/requirements.lock

# 2) The package itself, without touching the dependencies installed above.
COPY pyproject.toml README.md /tmp/trialq-build/
COPY src/ /tmp/trialq-build/src/
RUN python3 -m pip install --no-cache-dir --no-deps /tmp/trialq-build \
    && rm -rf /tmp/trialq-build
# The command below: `trialq worker` with its GPUs and slots from the environment.
COPY docker/worker-cmd.sh /usr/local/bin/trialq-worker-cmd

# A non-root user with a home for the caches PyTorch writes (~/.cache: TorchInductor, Triton).
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
