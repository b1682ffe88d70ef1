"""`submit-study --local` for an entrypoint whose framework is not installed here: no worker
is told to preload it, one warning line says so, and the study runs (issue 36.7; before,
every worker refused to start: `--preload torch: ModuleNotFoundError`).

The framework is a fake, named as one: a registry entry added in the driver's process
(`fakeflow_not_installed`, installed nowhere), which the trial module's entrypoint names in
an import it never reaches. Nothing else about the run is faked: real workers, the embedded
Redis, SQLite beside the spec.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

FAKE = "fakeflow_not_installed"

TRIAL_FILE = f"""
def train(params, trial):
    if params["x"] > 100:  # never: the fake framework is named, not imported
        import {FAKE}
    return {{"score": params["x"]}}
"""

SPEC = """
[study]
name = "fake-framework"
metric = "score"
n_trials = 2
[trial]
entrypoint = "mytrial:train"
[space.x]
type = "float"
low = 0
high = 1
"""

DRIVER = f"""
from trialq.wire import frameworks
frameworks.REVEALED_BY[{FAKE!r}] = {FAKE!r}  # the fake registry entry
frameworks.PRELOAD[{FAKE!r}] = ({FAKE!r},)
from trialq.cli import submit_study_main
raise SystemExit(submit_study_main())
"""


def test_a_study_whose_framework_is_not_installed_runs_under_local(tmp_path: Path) -> None:
    (tmp_path / "mytrial.py").write_text(TRIAL_FILE)
    (tmp_path / "study.toml").write_text(textwrap.dedent(SPEC))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALQ_")}
    env["TRIALQ_BROKER_URL"] = "redis://127.0.0.1:1/0"  # nothing listens: --local needs none
    command = [sys.executable, "-c", DRIVER, "study.toml", "--local", "--workers", "1"]
    done = subprocess.run(
        [*command, "--json", "--no-progress"], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["n_complete"] == 2
    warned = [line for line in done.stderr.splitlines() if FAKE in line]
    assert len(warned) == 1 and "not installed" in warned[0], done.stderr[-3000:]
