#!/usr/bin/env bash
# Prepare one Linux GPU host for trialq's compose cluster:
#   1. check the NVIDIA driver (nvidia-smi) and Docker Engine with the compose plugin;
#   2. install the NVIDIA Container Toolkit if it is missing (apt or dnf);
#   3. register the nvidia runtime with Docker (nvidia-ctk writes /etc/docker/daemon.json;
#      docker/daemon.json shows the result) and restart Docker;
#   4. verify: a CUDA container sees the GPUs.
# It installs neither the driver nor Docker (both are the host's own business) and never makes
# nvidia Docker's default runtime (docker/README.md, "NVIDIA Container Toolkit on a shared host").
#
# Usage: sudo docker/setup-gpu-host.sh [--check-only] [--cuda-image IMAGE]
#   --check-only        install and configure nothing; exit 1 at the first thing missing
#                       (the final check still pulls and runs the CUDA image)
#   --cuda-image IMAGE  the CUDA image for the final check (default: $CUDA_TEST_IMAGE or
#                       nvidia/cuda:12.8.1-base-ubuntu24.04)

set -euo pipefail

readonly TOOLKIT_REPO="https://nvidia.github.io/libnvidia-container"
readonly TOOLKIT_KEYRING="/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
# TensorFlow's CUDA 12 wheels need a driver of the CUDA 12 family (525.60 or newer).
readonly MIN_DRIVER_MAJOR=525

CUDA_IMAGE="${CUDA_TEST_IMAGE:-nvidia/cuda:12.8.1-base-ubuntu24.04}"
CHECK_ONLY=false

log() { printf '==> %s\n' "$*"; }
warn() { printf 'warning: %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

usage() {
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
}

parse_args() {
    while [ "$#" -gt 0 ]; do
        case "$1" in
            --check-only) CHECK_ONLY=true ;;
            --cuda-image)
                [ "$#" -ge 2 ] || { usage >&2; exit 2; }
                CUDA_IMAGE="$2"
                shift
                ;;
            -h | --help) usage; exit 0 ;;
            *) printf 'error: unknown argument: %s\n' "$1" >&2; usage >&2; exit 2 ;;
        esac
        shift
    done
}

check_driver() {
    command -v nvidia-smi >/dev/null 2>&1 \
        || die "nvidia-smi not found: install the NVIDIA driver first (your distribution's driver package), reboot, and run this again"
    local gpus
    gpus="$(nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader)" \
        || die "nvidia-smi failed: the driver is installed but not loaded (reboot?)"
    log "GPUs seen by the driver:"
    printf '    %s\n' "$gpus"
    local driver_major
    driver_major="$(printf '%s\n' "$gpus" | head -n 1 | cut -d, -f3 | tr -d ' ' | cut -d. -f1)"
    if [ "${driver_major:-0}" -lt "$MIN_DRIVER_MAJOR" ]; then
        warn "driver ${driver_major} is older than ${MIN_DRIVER_MAJOR}: TensorFlow's CUDA 12 build will not start"
    fi
    log "GPU count: $(printf '%s\n' "$gpus" | wc -l) (one worker-gpuN service per GPU: docker/README.md)"
}

check_docker() {
    command -v docker >/dev/null 2>&1 || die "docker not found: install Docker Engine first"
    docker info >/dev/null 2>&1 \
        || die "cannot reach the Docker engine: is it running, and are you root or in the docker group?"
    docker compose version >/dev/null 2>&1 || die "the Docker Compose v2 plugin ('docker compose') is missing"
    log "Docker $(docker version --format '{{.Server.Version}}'), $(docker compose version --short 2>/dev/null || echo 'compose ?')"
}

nvidia_runtime_registered() {
    docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q '"nvidia"'
}

require_root() {
    [ "$(id -u)" -eq 0 ] || die "$1 needs root: run with sudo"
}

install_toolkit() {
    if command -v nvidia-ctk >/dev/null 2>&1; then
        log "NVIDIA Container Toolkit present: $(nvidia-ctk --version | head -n 1)"
        return
    fi
    "$CHECK_ONLY" && die "NVIDIA Container Toolkit (nvidia-ctk) not installed"
    require_root "installing the NVIDIA Container Toolkit"
    if command -v apt-get >/dev/null 2>&1; then
        log "installing nvidia-container-toolkit (apt)"
        curl -fsSL "${TOOLKIT_REPO}/gpgkey" | gpg --batch --yes --dearmor -o "$TOOLKIT_KEYRING"
        curl -fsSL "${TOOLKIT_REPO}/stable/deb/nvidia-container-toolkit.list" \
            | sed "s#deb https://#deb [signed-by=${TOOLKIT_KEYRING}] https://#g" \
            > /etc/apt/sources.list.d/nvidia-container-toolkit.list
        apt-get update
        apt-get install -y nvidia-container-toolkit
    elif command -v dnf >/dev/null 2>&1; then
        log "installing nvidia-container-toolkit (dnf)"
        curl -fsSL "${TOOLKIT_REPO}/stable/rpm/nvidia-container-toolkit.repo" \
            -o /etc/yum.repos.d/nvidia-container-toolkit.repo
        dnf install -y nvidia-container-toolkit
    else
        die "neither apt-get nor dnf found: install nvidia-container-toolkit by hand, then run this again"
    fi
}

configure_runtime() {
    if nvidia_runtime_registered; then
        log "Docker already has the nvidia runtime"
        return
    fi
    "$CHECK_ONLY" && die "Docker has no nvidia runtime: run 'nvidia-ctk runtime configure --runtime=docker' and restart Docker"
    require_root "configuring Docker"
    log "registering the nvidia runtime in /etc/docker/daemon.json (keeps your other settings)"
    nvidia-ctk runtime configure --runtime=docker
    log "restarting Docker"
    systemctl restart docker
    nvidia_runtime_registered || die "Docker still lists no nvidia runtime after the restart"
}

verify_gpu_container() {
    log "checking that a CUDA container sees the GPUs (${CUDA_IMAGE})"
    docker run --rm --gpus all "$CUDA_IMAGE" nvidia-smi -L \
        || die "the CUDA container could not use the GPUs; see 'journalctl -u docker' and the toolkit's debug log (docker/README.md)"
    log "ready: cp .env.example .env, fill in the passwords, then 'docker compose up -d'"
}

main() {
    parse_args "$@"
    check_driver
    check_docker
    install_toolkit
    configure_runtime
    verify_gpu_container
}

main "$@"
