"""Naive Celery: what a user would write first. One trial per process, nothing preloaded.

    celery -A benchmarks.naive_celery worker --concurrency 1 --max-tasks-per-child 1

Stock prefork pool, `worker_max_tasks_per_child=1`, one message at a time, acknowledged late;
the trial imports its framework itself. With `NAIVE_PRELOAD=tensorflow` the worker's parent
imports TensorFlow first (the candidate that halves the naive cost, and no more).
"""

from __future__ import annotations

import importlib
import os
import time
from typing import Any

from celery import Celery, signals

from benchmarks.trials import WORKLOADS

BROKER_URL = os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/13")
TASK_NAME = "benchmarks.naive_trial"

app = Celery("naive", broker=BROKER_URL, backend=BROKER_URL)
app.conf.update(
    worker_max_tasks_per_child=1,
    worker_prefetch_multiplier=1,
    task_acks_late=True,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_hijack_root_logger=False,
)


@app.task(name=TASK_NAME)
def naive_trial(workload: str, params: dict[str, Any]) -> dict[str, Any]:
    """Run the trial in this pool process and say which process it was."""
    value = WORKLOADS[workload](params)
    return {"value": value, "worker_pid": os.getpid(), "end": time.time()}


@signals.worker_init.connect
def _preload(**_: Any) -> None:
    for name in filter(None, os.environ.get("NAIVE_PRELOAD", "").split(",")):
        importlib.import_module(name)
