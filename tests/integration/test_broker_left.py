"""What a study leaves in Redis once it ends: nothing for any trial told (issue 42: every
trial left its result and Celery's meta, 2 KB, for a week, and a long study filled the
broker). Only keys that do not grow with the trials stay (workers' heartbeats, kombu's
bindings, the orphaned checkpoints' list)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from waiting import wait_until

from trialq.settings import Settings
from trialq.submit import submit_study

pytestmark = pytest.mark.integration

STUDY_LEVEL = (
    "trialq:worker:",  # each worker's heartbeat, and its GPUs beside it
    "trialq:worker-gpus:",
    "_kombu.binding",  # kombu's record of each queue's exchange (and of its deadlines)
    "trialq:queue-running:",  # a set per queue, emptied as trials end
    "trialq:checkpoints:orphaned",
)
"""The keys a run may leave that are not a trial's: a few per worker or queue, whatever the
number of trials."""
STUDY_LEVEL_B = tuple(prefix.encode() for prefix in STUDY_LEVEL)


def test_a_study_leaves_no_key_of_any_told_trial(
    write_spec: Callable[..., Path], start_workers: Callable[..., object], redis_url: str
) -> None:
    start_workers(2)
    spec = write_spec(
        """
        [study]
        name = "left"
        direction = "maximize"
        metric = "score"
        n_trials = 8
        max_in_flight = 2
        [trial]
        entrypoint = "trials:quadratic"
        timeout_s = 60
        [space.x]
        type = "float"
        low = -5
        high = 5
        """
    )
    summary = submit_study(spec, Settings(broker_url=redis_url), None, None, None,
                           show_progress=False)  # fmt: skip
    assert summary["n_complete"] == 8
    task_ids = [t["user_attrs"]["task_id"] for t in summary["trials"]]

    client = redis.Redis.from_url(redis_url)

    def left() -> list[str]:
        return sorted(k.decode() for k in client.keys("*") if not k.startswith(STUDY_LEVEL_B))

    # The last trials' processes are still ending as the driver returns (their beacons go
    # with them): what is left must go within the minute, not within the key TTL.
    wait_until(lambda: not left(), 60, lambda: f"no key of a trial left, still: {left()}")
    keys = [k.decode() for k in client.keys("*")]
    assert not [k for k in keys if any(task_id in k for task_id in task_ids)]
