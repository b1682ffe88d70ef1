"""The notebook example, executed cell by cell in a real kernel (nbclient): an Optuna
objective defined in a cell runs unchanged on local workers, each trial in its own process."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "notebook" / "optuna_objective.ipynb"


def test_the_notebook_example_runs_its_objective_on_local_workers(tmp_path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("sklearn")
    notebook = nbformat.read(shutil.copy(NOTEBOOK, tmp_path), as_version=4)

    client = nbclient.NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    )
    client.execute()

    outputs = [
        "".join(out["text"] for out in cell.get("outputs", []) if out.get("name") == "stdout")
        for cell in notebook.cells
        if cell.cell_type == "code"
    ]
    count, best = outputs[2].split()[:2]
    assert int(count) == 4
    assert 0.5 < float(best) <= 1.0, "a linear model on digits scores well above chance"
    assert outputs[3].strip() == "6", "the second call ran 2 more"
    assert (tmp_path / "objective.db").exists(), "the study beside the notebook"
