"""What a trial prints reaches its worker's log up to a cap, then one line says the rest was
dropped (issue 38, row 10: 100 MB of a trial's output all went into the worker's log)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from trial_requests import trial_request
from waiting import wait_until

from trialq._celery.dispatcher import CeleryDispatcher
from trialq.local import LocalCluster
from trialq.settings import Settings
from trialq.wire.dispatch import TaskPhase
from trialq.wire.messages import Outcome

pytestmark = pytest.mark.integration

CAP = 200_000


def test_a_trial_printing_20_mb_puts_its_cap_into_the_log_and_says_so_once(
    start_workers: Callable[..., LocalCluster], redis_url: str
) -> None:
    env = {"TRIALQ_PRELOAD": "none", "TRIALQ_TRIAL_OUTPUT_MAX_BYTES": str(CAP)}
    cluster = start_workers(1, extra_env=env)
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url))
    task_id = dispatcher.submit(
        trial_request(entrypoint="trials:prints_a_lot", params={"mb": 20}), "gpu"
    )

    status = wait_until(
        lambda: (s := dispatcher.statuses([task_id])[task_id]).phase is TaskPhase.FINISHED and s,
        120,
        "the trial to finish",
    )

    assert status.result is not None and status.result.outcome is Outcome.OK
    logs = "".join(path.read_text() for path in cluster.log_dir.glob("*.log"))
    printed = logs.count("y" * 999)
    assert 0 < printed <= CAP // 1000, printed
    assert logs.count("trial output capped at 200000 bytes") == 1
    assert len(logs) < 2_000_000, "the trial's output was not capped"


def test_a_trials_prints_are_info_lines_naming_it_and_go_into_its_attempts_own_log(
    start_workers: Callable[..., LocalCluster], redis_url: str
) -> None:
    cluster = start_workers(1, extra_env={"TRIALQ_PRELOAD": "none"})
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url))
    request = trial_request(entrypoint="trials:prints_and_raises", number=7)
    task_id = dispatcher.submit(request, "gpu")

    status = wait_until(
        lambda: (s := dispatcher.statuses([task_id])[task_id]).phase is TaskPhase.FINISHED and s,
        120,
        "the trial to finish",
    )

    assert status.result is not None and status.result.outcome is Outcome.ERROR
    own = cluster.log_dir / request.study / "trial-7-attempt-1.log"
    assert status.result.log_file == str(own)
    text = own.read_text()
    assert "hello from the trial's print" in text and "a line on the trial's stderr" in text
    assert "failed after printing" in text, "trialq's line about its end is not in its log"
    worker_log = "".join(path.read_text() for path in cluster.log_dir.glob("*.log"))
    (printed,) = [line for line in worker_log.splitlines() if "hello from the trial's" in line]
    assert " INFO celery.redirected " in printed and " trial=7 attempt=1 " in printed
