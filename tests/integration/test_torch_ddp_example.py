"""The DDP example (`trialq.examples.torch_ddp`) through a real worker, on CPU: its two gloo
ranks train and rank 0's metric completes the trial; and when the trial runs out of time or
its process is killed mid-training, no rank outlives it (issue 27.4)."""

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
from trialq.submit import submit_study
from trialq.wire.dispatch import TaskPhase, TaskStatus
from trialq.wire.entrypoint import Entrypoint
from trialq.wire.messages import Outcome, TrialRequest

pytestmark = pytest.mark.integration

EXAMPLE_SPEC = Path(__file__).parents[2] / "examples" / "torch_ddp" / "study.toml"
WORKER_ENV = {"TRIALQ_PRELOAD": "torch"}
RANKS = 2
GONE_WITHIN_S = 30.0
"""How long after its trial ended a rank may still run (the group's grace is 2 s)."""
FIRST_STEP_WITHIN_S = 90.0
"""How long the ranks may take to start and make their first step on a loaded CPU."""
FOREVER = 10**9
"""Steps enough that the ranks are still training when the trial is ended."""


@pytest.fixture(autouse=True)
def _needs_torch_and_sklearn() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")


@pytest.fixture
def pids_file(tmp_path: Path) -> Iterator[Path]:
    """Where the ranks write `<rank> <pid>`; whatever still runs is killed after the test."""
    path = tmp_path / "ranks"
    yield path
    for pid in _rank_pids(path):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _rank_pids(path: Path) -> list[int]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [int(line.split()[1]) for line in lines if line.strip()]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_example_trains_on_two_ranks_and_completes_with_rank_0s_metric(
    tmp_path: Path, start_workers: Callable[..., LocalCluster], redis_url: str
) -> None:
    text = EXAMPLE_SPEC.read_text()
    assert "\ngpus = 2\n" in text, "the example's spec asks for 2 GPUs a trial"
    spec = tmp_path / "study.toml"
    spec.write_text(text.replace("\ngpus = 2\n", "\n"))  # CPU workers have no 2-GPU slots
    start_workers(1, extra_env=WORKER_ENV)

    summary = submit_study(spec, Settings(broker_url=redis_url), None, 1, None, False)

    (trial,) = summary["trials"]
    attrs = trial["user_attrs"]
    assert trial["state"] == "COMPLETE", attrs.get("error")
    assert attrs["metrics"]["world_size"] == RANKS
    assert trial["values"] == [attrs["metrics"]["val_accuracy"]]
    assert attrs["metrics"]["val_accuracy"] > 0.3, "ten classes: chance is 0.1"


def _submit(redis_url: str, pids: Path, **limits: float) -> tuple[CeleryDispatcher, str]:
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url))
    trial = TrialRequest(
        study="ddp", number=0, attempt=1,
        params={"steps": FOREVER, "rank_pids_file": str(pids)},
        entrypoint=Entrypoint("trialq.examples.torch_ddp", "train"), **limits,
    )  # fmt: skip
    return dispatcher, dispatcher.submit(trial, "gpu")


def _final(dispatcher: CeleryDispatcher, task_id: str) -> TaskStatus:
    final = (TaskPhase.FINISHED, TaskPhase.FAILED)
    statuses = wait_until(
        lambda: (s := dispatcher.statuses([task_id])) and s[task_id].phase in final and s,
        FIRST_STEP_WITHIN_S + 60, "the trial to end",
    )  # fmt: skip
    return statuses[task_id]


def _ranks_training(pids: Path) -> list[int]:
    return wait_until(
        lambda: len(found := _rank_pids(pids)) == RANKS and found,
        FIRST_STEP_WITHIN_S, "both ranks to make their first step",
    )  # fmt: skip


def _ranks_end(ranks: list[int]) -> None:
    assert len(ranks) == RANKS, f"the ranks did not all start: {ranks}"
    wait_until(
        lambda: not any(_alive(pid) for pid in ranks), GONE_WITHIN_S,
        lambda: f"the trial's ranks to end; running: {[p for p in ranks if _alive(p)]}",
    )  # fmt: skip


def test_no_rank_outlives_a_trial_that_runs_out_of_time(
    start_workers: Callable[..., LocalCluster], redis_url: str, pids_file: Path
) -> None:
    start_workers(1, extra_env=WORKER_ENV)
    # Time enough for both ranks to import torch and step on a loaded CPU before the limit.
    dispatcher, task_id = _submit(redis_url, pids_file, timeout_s=45.0, hard_limit_s=90.0)
    ranks = _ranks_training(pids_file)

    status = _final(dispatcher, task_id)

    assert status.result is not None and status.result.outcome is Outcome.TIMEOUT, status
    _ranks_end(ranks)


def test_no_rank_outlives_a_trial_process_killed_mid_training(
    start_workers: Callable[..., LocalCluster], redis_url: str, pids_file: Path
) -> None:
    start_workers(1, extra_env=WORKER_ENV)
    dispatcher, task_id = _submit(redis_url, pids_file, timeout_s=300.0, hard_limit_s=360.0)
    ranks = _ranks_training(pids_file)
    trial_process = os.getpgid(ranks[0])  # the trial process leads the ranks' group
    assert trial_process == os.getpgid(ranks[1]) != os.getpgrp()

    os.kill(trial_process, signal.SIGKILL)

    assert _final(dispatcher, task_id).phase in (TaskPhase.FINISHED, TaskPhase.FAILED)
    _ranks_end(ranks)
