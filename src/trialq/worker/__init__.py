"""The whole worker: its parent process (its state, `WorkerState`; its trial slots, heartbeat,
preemption, preloading and prewarming) and the child's shell around a trial (`child`: the
result it stores, its log, its threads); no Celery (the Celery edge, `trialq._celery.lifecycle`,
calls its steps). What runs inside the trial itself is `trialq.trial`.

`celery -A trialq.worker worker` finds the worker's Celery app here under its public name,
`app`: built on first use, from the environment's settings, by the Celery edge. Importing
this package builds nothing and imports no Celery.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """`app`, the Celery app `celery -A trialq.worker` runs (built on first use)."""
    if name == "app":
        from trialq._celery.worker import app_from_environment

        return app_from_environment()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
