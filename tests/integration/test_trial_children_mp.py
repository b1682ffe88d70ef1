"""A trial may start children with `multiprocessing` (a PyTorch DataLoader's workers, DDP
ranks): the worker's pool marks its processes daemonic, which `multiprocessing` refuses
children to; trialq lifts that in the trial's process, whose children end with it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from trial_requests import trial_request
from waiting import wait_until

from trialq._celery.dispatcher import CeleryDispatcher
from trialq.settings import Settings
from trialq.wire.dispatch import TaskPhase
from trialq.wire.messages import Outcome

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_trial_can_start_a_multiprocessing_pool(
    start_workers: Callable[..., object], redis_url: str, method: str
) -> None:
    start_workers(1, extra_env={"TRIALQ_PRELOAD": "none"})
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url))
    request = trial_request(entrypoint="trials:uses_multiprocessing", params={"method": method})
    task_id = dispatcher.submit(request, "gpu")

    status = wait_until(
        lambda: (s := dispatcher.statuses([task_id])[task_id]).phase is TaskPhase.FINISHED
        and s,
        120,
        "the trial to finish",
    )

    assert status.result is not None
    assert status.result.outcome is Outcome.OK, status.result.error
    assert status.result.metrics == {"value": 6.0}
