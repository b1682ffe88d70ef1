"""A trial's library threads: the worker's cores shared among its trials in flight, or the
spec's `[trial] cpus` (issue 39, item 4)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable

import pytest
from trial_requests import trial_request
from waiting import wait_until

from trialq._celery.dispatcher import CeleryDispatcher
from trialq.local import LocalCluster
from trialq.settings import Settings
from trialq.wire.dispatch import TaskPhase
from trialq.wire.messages import Outcome, TrialResult
from trialq.worker.threads import threads_per_trial

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="no PyTorch"),
]


def _results(dispatcher: CeleryDispatcher, task_ids: list[str]) -> list[TrialResult]:
    def finished() -> list[TrialResult] | None:
        statuses = dispatcher.statuses(task_ids)
        if any(s.phase is not TaskPhase.FINISHED for s in statuses.values()):
            return None
        return [statuses[t].result for t in task_ids]  # type: ignore[misc]

    return wait_until(finished, 180, "the trials to finish")


def test_two_trials_in_flight_share_the_cores_and_a_spec_can_say_otherwise(
    start_workers: Callable[..., LocalCluster], redis_url: str
) -> None:
    start_workers(2, extra_env={"TRIALQ_PRELOAD": "torch"})  # set_num_threads in the child
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url))
    together = [
        dispatcher.submit(
            trial_request(entrypoint="trials:reports_threads", number=n, params={"sleep_s": 2}),
            "gpu",
        )
        for n in (0, 1)
    ]

    share = threads_per_trial(len(os.sched_getaffinity(0)), 2)
    for result in _results(dispatcher, together):
        assert result.outcome is Outcome.OK, result.error
        assert result.metrics["torch_threads"] == share and result.metrics["omp"] == share

    asked = trial_request(entrypoint="trials:reports_threads", number=2, cpus=3)
    (result,) = _results(dispatcher, [dispatcher.submit(asked, "gpu")])
    assert result.metrics["torch_threads"] == 3 and result.metrics["omp"] == 3


def test_a_trials_share_of_the_cores() -> None:
    assert threads_per_trial(2, 2) == 1
    assert threads_per_trial(16, 3) == 5
    assert threads_per_trial(2, 4) == 1
