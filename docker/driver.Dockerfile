# syntax=docker/dockerfile:1
#
# trialq driver: submit-study, the Optuna dashboard and Flower. No TensorFlow: the driver
# only asks Optuna for parameters and tells it the results.
# Build from the repository root (compose.yaml does this for you):
#   docker build -f docker/driver.Dockerfile -t trialq-driver:0.1.0 .

ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
FROM ${PYTHON_IMAGE}

# Tools that run from this image beside submit-study, pinned here (they are not trialq's
# dependencies, so pyproject.toml does not list them).
ARG OPTUNA_DASHBOARD_VERSION=0.21.0
ARG FLOWER_VERSION=2.2.0

LABEL org.opencontainers.image.title="trialq-driver" \
      org.opencontainers.image.description="trialq driver: submit-study, optuna-dashboard, Flower" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# 1) Dependencies from pyproject.toml (core + postgres), cached across code changes.
COPY pyproject.toml docker/requirements-from-pyproject.py /tmp/trialq-build/
RUN python3 /tmp/trialq-build/requirements-from-pyproject.py \
        /tmp/trialq-build/pyproject.toml postgres > /tmp/trialq-build/requirements.txt \
    && python3 -m pip install --no-cache-dir -r /tmp/trialq-build/requirements.txt \
        "optuna-dashboard==${OPTUNA_DASHBOARD_VERSION}" "flower==${FLOWER_VERSION}"

# 2) The package itself.
COPY README.md /tmp/trialq-build/
COPY src/ /tmp/trialq-build/src/
RUN python3 -m pip install --no-cache-dir --no-deps /tmp/trialq-build \
    && rm -rf /tmp/trialq-build

# The example study, so `submit-study /app/examples/digits/study.toml` works out of the box,
# and Flower's configuration (its login comes from a secret file).
COPY examples/ /app/examples/
COPY docker/flowerconfig.py /app/flowerconfig.py

RUN useradd --create-home --uid 10001 --user-group --shell /usr/sbin/nologin trialq
USER 10001:10001
WORKDIR /home/trialq

CMD ["submit-study", "--help"]
