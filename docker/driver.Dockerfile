# syntax=docker/dockerfile:1
#
# trialq driver: submit-study, the Optuna dashboard and Flower. No TensorFlow: the driver
# only asks Optuna for parameters and tells it the results.
# Build from the repository root (compose.yaml does this for you):
#   docker build -f docker/driver.Dockerfile -t trialq-driver:0.1.0 .

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
FROM ${PYTHON_IMAGE}

LABEL org.opencontainers.image.title="trialq-driver" \
      org.opencontainers.image.description="trialq driver: submit-study, optuna-dashboard, Flower" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# 1) Dependencies, exactly as locked (docker/lock.sh): trialq's core and postgres extra from
#    pyproject.toml's ranges, plus the tools that run beside submit-study (optuna-dashboard and
#    Flower, pinned in docker/driver-tools.in), each checked against its hash. No TensorFlow.
COPY docker/driver.lock /tmp/trialq-build/requirements.lock
RUN python3 -m pip install --no-cache-dir --require-hashes -r /tmp/trialq-build/requirements.lock

# 2) The package itself, without touching the dependencies installed above.
COPY pyproject.toml README.md /tmp/trialq-build/
COPY src/ /tmp/trialq-build/src/
RUN python3 -m pip install --no-cache-dir --no-deps /tmp/trialq-build \
    && rm -rf /tmp/trialq-build

# The example study, so `submit-study /app/examples/digits/study.toml` works out of the box,
# and Flower's configuration (its login comes from a secret file).
COPY examples/ /app/examples/
COPY docker/flowerconfig.py /app/flowerconfig.py

RUN useradd --create-home --uid 10001 --user-group --shell /usr/sbin/nologin trialq
# The dashboard mounts the workers' artifact volume here (compose.yaml): whichever image
# creates the named volume first gives it this folder's owner, the workers' user.
RUN mkdir -p /var/lib/trialq/artifacts && chown -R 10001:10001 /var/lib/trialq
USER 10001:10001
WORKDIR /home/trialq

CMD ["submit-study", "--help"]
