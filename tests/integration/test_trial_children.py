"""Every process a trial starts ends with it (issue 26.4): the trial process leads a process
group of its own, ended when the trial returns, raises or runs out of time, and by the
worker's parent when the trial process itself was killed."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from waiting import wait_until

from trialq._celery.dispatcher import CeleryDispatcher
from trialq.local import LocalCluster
from trialq.settings import Settings
from trialq.wire.dispatch import TaskPhase, TaskStatus
from trialq.wire.entrypoint import Entrypoint
from trialq.wire.messages import Outcome, TrialRequest

pytestmark = pytest.mark.integration

GONE_WITHIN_S = 30.0
"""How long after its trial ended a child may still run (the grace is 2 s)."""


@pytest.fixture
def pids_file(tmp_path: Path) -> Iterator[Path]:
    """Where the trial writes its children's pids; whatever still runs is killed after."""
    path = tmp_path / "children"
    yield path
    for pid in _pids(path):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _run(redis_url: str, pids: Path, **request: object) -> TaskStatus:
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url))
    fields = {"timeout_s": 60.0, "hard_limit_s": 120.0, **request}
    params = {"pids": str(pids), **fields.pop("params", {})}  # type: ignore[dict-item]
    trial = TrialRequest(
        study="children", number=0, attempt=1, params=params,
        entrypoint=Entrypoint("trials", "starts_children"), **fields,  # type: ignore[arg-type]
    )  # fmt: skip
    task_id = dispatcher.submit(trial, "gpu")
    final = (TaskPhase.FINISHED, TaskPhase.FAILED)
    statuses = wait_until(
        lambda: (s := dispatcher.statuses([task_id])) and s[task_id].phase in final and s,
        90, "the trial to end",
    )  # fmt: skip
    return statuses[task_id]


def _children_end(pids: Path) -> None:
    children = _pids(pids)
    assert len(children) == 2, "the trial did not start its children"
    wait_until(
        lambda: not any(_alive(pid) for pid in children), GONE_WITHIN_S,
        lambda: f"the trial's children to end; running: {[p for p in children if _alive(p)]}",
    )  # fmt: skip


@pytest.mark.parametrize(("then", "outcome"), [("return", Outcome.OK), ("raise", Outcome.ERROR)])
def test_children_end_when_the_trial_returns_or_raises(
    start_workers: Callable[..., LocalCluster],
    redis_url: str,
    pids_file: Path,
    then: str,
    outcome: Outcome,
) -> None:
    start_workers(1, extra_env={"TRIALQ_PRELOAD": "none"})
    status = _run(redis_url, pids_file, params={"then": then})
    assert status.result is not None and status.result.outcome is outcome, status
    _children_end(pids_file)


@pytest.mark.parametrize("how", ["fork", "multiprocessing", "subprocess"])
def test_children_end_and_never_end_the_trial_however_they_were_made(
    start_workers: Callable[..., LocalCluster], redis_url: str, pids_file: Path, how: str
) -> None:
    """Issue 38, row 3: a bare `os.fork()` child, a copy of the trial's stack, unwound
    through the group's cleanup when it got SIGTERM and SIGTERMed the whole group, the
    trial process included, before its result was stored (told `crashed: signal 15`)."""
    start_workers(1, extra_env={"TRIALQ_PRELOAD": "none"})
    status = _run(redis_url, pids_file, params={"then": "return", "how": how})
    assert status.result is not None, status
    assert status.result.outcome is Outcome.OK, status.result.error
    _children_end(pids_file)


def test_children_end_when_the_trial_runs_out_of_time(
    start_workers: Callable[..., LocalCluster], redis_url: str, pids_file: Path
) -> None:
    start_workers(1, extra_env={"TRIALQ_PRELOAD": "none"})
    status = _run(
        redis_url, pids_file, timeout_s=5.0, hard_limit_s=30.0, params={"then": "overrun"}
    )
    assert status.result is not None and status.result.outcome is Outcome.TIMEOUT, status
    _children_end(pids_file)


def test_children_end_when_the_trial_process_is_killed_at_the_hard_limit(
    start_workers: Callable[..., LocalCluster], redis_url: str, pids_file: Path
) -> None:
    start_workers(1, extra_env={"TRIALQ_PRELOAD": "none"})
    # Limits past a loaded host's start of the trial, which must write its children's pids.
    request = {"timeout_s": 5.0, "hard_limit_s": 8.0}
    _run(redis_url, pids_file, **request, params={"then": "overrun", "ignore_limit": True})
    _children_end(pids_file)
