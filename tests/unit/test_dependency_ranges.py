"""pyproject.toml's dependencies: every package src/trialq imports is declared, the packages
whose internals trialq leans on have an upper bound, and constraints/oldest.txt (what .ci/run
installs into .venv-oldest and tests) pins each one at exactly its declared lower bound."""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = REPO_ROOT / "src" / "trialq"
OLDEST = REPO_ROOT / "constraints" / "oldest.txt"

DISTRIBUTIONS_OF_MODULE = {
    "yaml": {"pyyaml"},
    "sklearn": {"scikit-learn"},
    "pynvml": {"nvidia-ml-py"},
    "pydantic_settings": {"pydantic-settings"},
    "tensorflow": {"tensorflow", "tensorflow-cpu"},
    "psycopg2": {"psycopg2-binary", "psycopg2"},
    "mlflow": {"mlflow", "mlflow-skinny"},
}
"""Top-level modules whose distribution has another name (the rest are named alike)."""

UPPER_BOUNDED = {
    "celery",
    "kombu",
    "billiard",
    "redis",
    "optuna",
    "sqlalchemy",
    "tensorflow",
    "tensorflow-cpu",
    "keras",
}
"""trialq reaches into these (Celery's pool, Optuna's storage models, Keras' callbacks): a
new minor release is taken only after the tests have passed on it."""

OLDEST_EXTRAS = ("cpu", "tf", "postgres", "report")
"""Extras whose packages the oldest run installs (tf's tensorflow as its twin tensorflow-cpu,
the same source and version)."""

OLDEST_DEV = {"pytest", "pytest-timeout"}
"""Of the dev extra, the test runner; linters and deploy checks do not run in .venv-oldest."""


def _project() -> dict[str, object]:
    with (REPO_ROOT / "pyproject.toml").open("rb") as handle:
        project: dict[str, object] = tomllib.load(handle)["project"]
    return project


def _requirements(*extras: str) -> list[Requirement]:
    project = _project()
    optional = project["optional-dependencies"]
    assert isinstance(optional, dict)
    chosen = list(project["dependencies"])  # type: ignore[call-overload]
    for extra in extras:
        chosen.extend(optional[extra])
    return [Requirement(text) for text in chosen]


def _all_declared() -> dict[str, Requirement]:
    """Every requirement of the core and the extras by name; a name listed twice (keras in
    both tf and cpu) must have the same range each time."""
    optional = _project()["optional-dependencies"]
    assert isinstance(optional, dict)
    declared: dict[str, Requirement] = {}
    for requirement in _requirements(*optional):
        name = canonicalize_name(requirement.name)
        if name in declared and name != "trialq":
            assert declared[name].specifier == requirement.specifier, (declared[name], requirement)
        declared[name] = requirement
    return declared


def _imports_of(source: str) -> set[str]:
    """The top-level third-party modules of a module's absolute imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top != "trialq" and top not in sys.stdlib_module_names:
                found.add(top)
    return found


def _third_party_imports() -> dict[str, str]:
    """Top-level module -> one file of src/trialq importing it (at any depth, lazily too)."""
    found: dict[str, str] = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        for module in _imports_of(path.read_text(encoding="utf-8")):
            found.setdefault(module, str(path.relative_to(REPO_ROOT)))
    return found


def _lower_bound(requirement: Requirement) -> Version:
    bounds = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
    assert len(bounds) == 1, f"{requirement}: one `>=` lower bound expected"
    return bounds[0]


def _oldest_pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for raw in OLDEST.read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{OLDEST.name}: {line!r} is not pinned with =="
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_every_imported_package_is_declared() -> None:
    declared = set(_all_declared())
    imports = _third_party_imports()
    assert {"celery", "kombu", "billiard", "sqlalchemy", "optuna"} <= set(imports)
    missing = {
        module: where
        for module, where in imports.items()
        if not DISTRIBUTIONS_OF_MODULE.get(module, {canonicalize_name(module)}) & declared
    }
    assert not missing, f"imported but not in pyproject.toml: {missing}"


def test_the_import_scan_finds_what_is_missing() -> None:
    """The check above can fail: a lazy import is seen, the standard library and relative
    imports are not, and polars (which trialq never imports) is not declared."""
    source = "import os.path\nfrom . import sibling\nfrom trialq import x\n"
    source += "def f():\n    import polars.api\n"
    assert _imports_of(source) == {"polars"}
    assert "polars" not in _all_declared()


@pytest.mark.parametrize("name", sorted(UPPER_BOUNDED))
def test_packages_trialq_reaches_into_have_an_upper_bound(name: str) -> None:
    requirement = _all_declared()[name]
    uppers = [s for s in requirement.specifier if s.operator == "<"]
    assert uppers, f"{requirement}: no upper bound"
    assert _lower_bound(requirement) < Version(uppers[0].version)


def test_oldest_constraints_pin_every_direct_dependency_at_its_lower_bound() -> None:
    pins = _oldest_pins()
    declared = _all_declared()
    expected = {canonicalize_name(r.name) for r in _requirements(*OLDEST_EXTRAS)}
    expected = (expected - {"tensorflow"}) | OLDEST_DEV
    assert set(pins) == expected, (
        f"missing: {sorted(expected - set(pins))}, not direct: {sorted(set(pins) - expected)}"
    )
    wrong = {
        name: f"pinned {pin}, declared {declared[name].specifier}"
        for name, pin in pins.items()
        if pin != _lower_bound(declared[name]) or pin not in declared[name].specifier
    }
    assert not wrong, wrong


def test_tensorflow_and_its_cpu_twin_share_their_range() -> None:
    declared = _all_declared()
    assert declared["tensorflow"].specifier == declared["tensorflow-cpu"].specifier
