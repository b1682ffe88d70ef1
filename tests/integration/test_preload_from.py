"""`TRIALQ_PRELOAD_FROM`: a worker preloads what an entrypoint module imports at its top, and
its ready line says what it preloaded and what it left out, and why."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest
from waiting import wait_until

from trialq.local import LocalCluster

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="no scikit-learn"),
]


def test_the_ready_line_names_the_entrypoints_imports_preloaded_and_left_out(
    start_workers: Callable[..., LocalCluster], tmp_path: Path
) -> None:
    model = tmp_path / "model.py"
    model.write_text(
        "import os\nimport sklearn.linear_model\nimport helpers\nimport not_installed_xyz\n"
        "def train(params):\n    return 1.0\n"
    )
    (tmp_path / "helpers.py").write_text("")
    cluster = start_workers(1, extra_env={"TRIALQ_PRELOAD_FROM": str(model)})

    def ready_line() -> str | None:
        logs = "".join(path.read_text() for path in cluster.log_dir.glob("worker*.log"))
        return next((line for line in logs.splitlines() if "preloaded for trials:" in line), None)

    line = wait_until(ready_line, 120, "the worker's ready line")

    assert "preloaded for trials: sklearn.linear_model; left out: " in line, line
    assert "helpers (your own module: not run in the worker's parent)" in line
    assert "not_installed_xyz (not installed here)" in line
    logs = "".join(path.read_text() for path in cluster.log_dir.glob("worker*.log"))
    assert "superuser privileges" not in logs, "Celery's root warning, for a JSON-only worker"
