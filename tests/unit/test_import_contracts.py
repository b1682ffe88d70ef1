"""The import rules (docs/design.md, "Packages and their import rules") are import-linter
contracts in pyproject.toml, which CI checks with `lint-imports`. These tests check the
checker: it passes on the tree, it fails on a copy that breaks a rule (an indirect import
too), and the list of modules kept from importing Celery directly misses none."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "trialq"
CELERY_EDGE = "Only trialq._celery imports celery, kombu and billiard directly"
WORKER_ROOM = "The worker's parent never imports Celery or its edge"
GPU_ROOM = "The GPU package imports only trialq.errors"

RUN_LINT_IMPORTS = (
    "import sys; from importlinter.cli import lint_imports_command; "
    "sys.exit(lint_imports_command())"
)


def _contracts() -> dict[str, dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return {c["name"]: c for c in config["tool"]["importlinter"]["contracts"]}


def _top_level() -> set[str]:
    return {
        f"trialq.{path.stem}"
        for path in PACKAGE.iterdir()
        if (path.suffix == ".py" and path.name != "__init__.py")
        or (path.is_dir() and (path / "__init__.py").exists())
    }


def test_every_module_but_the_celery_edge_is_kept_from_importing_celery() -> None:
    """A new top-level module or package must join the list, or the rule would skip it."""
    contract = _contracts()[CELERY_EDGE]
    assert set(contract["source_modules"]) == _top_level() - {"trialq._celery"}
    assert contract["allow_indirect_imports"] is True


def test_the_gpu_package_is_kept_from_every_module_but_errors() -> None:
    """A new top-level module or package must join the list, or the GPU package could use it."""
    forbidden = set(_contracts()[GPU_ROOM]["forbidden_modules"])
    assert {m for m in forbidden if m.startswith("trialq.")} == _top_level() - {
        "trialq.gpu",
        "trialq.errors",
    }


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` over the trialq in `root`/src, with `root`'s pyproject.toml."""
    if os.environ.get("CI") != "true":
        pytest.importorskip("importlinter", reason="import-linter is in the dev extra")
    path = os.pathsep.join(filter(None, [str(root / "src"), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", RUN_LINT_IMPORTS, "--no-cache"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_tree_keeps_every_contract() -> None:
    done = _lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Contracts: {len(_contracts())} kept, 0 broken." in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("spec.py", "import celery", "The spec never imports Celery"),
        ("cli.py", "from celery.bin.celery import celery", CELERY_EDGE),
        (  # indirect: the driver's loop imports the wire's failures
            "wire/failures.py",
            "import tensorflow",
            "The driver side never imports TensorFlow, Keras or the trial side",
        ),
        (  # indirect: the trial's runner imports the wire's entrypoint
            "wire/entrypoint.py",
            "import sqlalchemy",
            "The trial side never imports the study storage (optuna, SQLAlchemy)",
        ),
        (
            "wire/heartbeat.py",
            "from trialq.views import rows",
            "The wire imports none of the processes it connects, nor the views",
        ),
        (
            "views/status.py",
            "import trialq._celery.dispatcher",
            "The views never import the Celery edge or the trial side",
        ),
        ("worker/state.py", "import trialq._celery.app", WORKER_ROOM),
        (  # indirect: the worker's state imports the wire's heartbeat
            "wire/heartbeat.py",
            "import kombu",
            WORKER_ROOM,
        ),
        (
            "worker/preemption.py",
            "import trialq.views.rows",
            "The worker's parent never imports the driver, the views or optuna",
        ),
        (
            "trial/runner.py",
            "import trialq.worker.slots",
            "Trial, wire, driver and views never import the worker's parent",
        ),
        (  # indirect: the driver's study imports the sampling rule
            "spec.py",
            "import trialq.driver.study",
            "The spec never imports the driver, the worker or the trial side",
        ),
        ("gpu/share.py", "import trialq.wire.keys", GPU_ROOM),
        ("gpu/device.py", "import torch", GPU_ROOM),
        (  # indirect: the views' summary imports what counts an out-of-memory trial
            "oom_stand_ins.py",
            "import trialq.driver.progress",
            "The views never import the driver side",
        ),
    ],
)
def test_a_broken_rule_fails_the_check(tmp_path: Path, module: str, line: str, broken: str) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    copy = tmp_path / "src" / "trialq"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / module).open("a", encoding="utf-8") as file:
        file.write(f"\n{line}  # noqa\n")

    done = _lint_imports(tmp_path)

    shown = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)  # older import-linters colour it anyway
    assert done.returncode != 0, shown
    assert f"{broken} BROKEN" in shown, shown
