"""Seeing a study run by real workers: status while it runs, status and report after,
and the structured log lines of the driver and of the workers' trial processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from report_checks import ALL_PLOTS, assert_page_loads_offline, assert_valid_png
from waiting import wait_until

from trialq.cli import trialq_main
from trialq.local import LocalCluster
from trialq.views.report import write_report

pytestmark = pytest.mark.integration

SPEC = """
[study]
name = "staged"
direction = "maximize"
n_trials = 7
max_in_flight = 1
pruner = "median"
pruner_args = { n_startup_trials = 2 }
search_space = "trials:staged_x"
[trial]
entrypoint = "trials:curve_or_raise"
timeout_s = 60
"""
RUN_SUBMIT_STUDY = "from trialq.cli import submit_study_main; raise SystemExit(submit_study_main())"
TESTS_DIR = Path(__file__).parents[1]


def _status_json(capsys: pytest.CaptureFixture[str], storage: str, broker: str) -> Any:
    code = trialq_main(["status", "staged", "--storage", storage, "--broker", broker, "--json"])
    captured = capsys.readouterr()
    return json.loads(captured.out) if code == 0 else None


def _wait_for_a_running_trial(
    capsys: pytest.CaptureFixture[str], storage: str, broker: str, driver: subprocess.Popen[str]
) -> dict[str, Any]:
    """`trialq status --json` while the study runs, until a worker says what it runs."""

    def running_worker() -> dict[str, Any] | None:
        if driver.poll() is not None:
            pytest.fail("the study ended before any worker showed a running trial")
        shown = _status_json(capsys, storage, broker)
        return next((w for w in (shown or {}).get("workers") or [] if w["running"]), None)

    return wait_until(running_worker, 120, "a worker to show a running trial", 0.1)


def test_a_study_run_by_real_workers_can_be_seen(
    write_spec: Callable[..., Path],
    start_workers: Callable[..., LocalCluster],
    redis_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = start_workers(2)
    spec = write_spec(SPEC)
    storage = f"sqlite:///{tmp_path / 'staged.db'}"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
    }
    command = [
        sys.executable,
        "-c",
        RUN_SUBMIT_STUDY,
        str(spec),
        "--broker",
        redis_url,
        "--no-progress",
        "-v",
    ]
    driver = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )

    busy = _wait_for_a_running_trial(capsys, storage, redis_url, driver)
    (running,) = busy["running"]
    assert running["study"] == "staged" and running["attempt"] == 1
    assert running["worker"] == busy["name"] and running["pid"] != busy["pid"]

    _, driver_log = driver.communicate(timeout=240)
    assert driver.returncode == 0, driver_log[-3000:]
    _assert_driver_logs(driver_log)
    _assert_worker_logs(cluster.log_dir)
    study = optuna.load_study(study_name="staged", storage=storage)
    # A worker clears what it runs just after the result is stored: a moment after the end.
    shown = wait_until(
        lambda: (s := _status_json(capsys, storage, redis_url))
        and all(w["running"] == [] for w in s["workers"])
        and s,
        30, "the workers to say they run nothing",
    )  # fmt: skip
    _assert_status_matches_storage(shown, study)
    _assert_report(study, tmp_path / "report")


def _assert_driver_logs(log: str) -> None:
    """submit-study -v: sent and told lines at INFO, each naming study, trial and attempt."""
    sent = re.findall(r" INFO trialq\.driver .*study=staged trial=(\d+) attempt=1 \| sent ", log)
    told = re.findall(r"study=staged trial=(\d+) attempt=1 \| told state=(\w+) outcome=(\w+)", log)
    assert sorted(map(int, sent)) == list(range(7))
    assert ("3", "FAIL", "error") in told and ("4", "PRUNED", "pruned") in told
    assert len(told) == 7


def _assert_worker_logs(log_dir: Path) -> None:
    """The trial process's own lines carry the trial (workers log at WARNING in tests)."""
    text = "".join(log.read_text() for log in log_dir.glob("worker*.log"))
    line = re.search(r"WARNING trialq\.runner .*study=staged trial=3 attempt=1 \| (.*)", text)
    assert line is not None, text[-3000:]
    assert line.group(1).startswith("trial finished outcome=error")
    assert "ValueError: refusing x=-1.0 on purpose" in line.group(1)


def _assert_status_matches_storage(shown: dict[str, Any], study: optuna.Study) -> None:
    states = Counter(t.state.name for t in study.trials)
    assert (shown["n_complete"], shown["n_pruned"], shown["n_failed"]) == (
        states["COMPLETE"], states["PRUNED"], states["FAIL"],
    )  # fmt: skip
    assert shown["outcomes"] == {"error": 1, "ok": 4, "pruned": 2}
    assert len(shown["workers"]) == 2 and all(w["running"] == [] for w in shown["workers"])
    attrs = shown["trials"][0]["user_attrs"]
    assert attrs["peak_rss_bytes"] > 0 and attrs["worker_host"]
    assert "gpu_memory_used_peak_bytes" in attrs and attrs["gpu_utilization_mean"] is None


def _assert_report(study: optuna.Study, out: Path) -> None:
    page = write_report(study, out)
    for name in ALL_PLOTS:
        assert_valid_png(out / f"{name}.png")
    assert_page_loads_offline(page, n_trials=7, n_plots=len(ALL_PLOTS))
