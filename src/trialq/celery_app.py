"""The Celery app and the settings that carry the design (DESIGN.md), shared by both ends.

Creating an app touches no network and no GPU; the driver makes one to send tasks, the
worker module makes the one `celery -A trialq.worker` finds.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from trialq.settings import Settings

TASK_NAME = "trialq.run_trial"
RESULT_TTL_S = 7 * 24 * 3600


def withdrawn_key(task_id: str) -> str:
    """The key that tells a worker not to run a task after all (revokes are not durable)."""
    return f"trialq:withdrawn:{task_id}"


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery settings that make one-process-per-trial safe (DESIGN.md)."""
    transport = {"visibility_timeout": settings.visibility_timeout_s}
    return {
        "worker_max_tasks_per_child": 1,
        "worker_prefetch_multiplier": 1,
        "task_acks_late": True,
        # Retries belong to the driver: Celery would requeue a killed trial forever, uncounted.
        "task_reject_on_worker_lost": False,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "task_track_started": True,
        "result_expires": RESULT_TTL_S,
        "broker_transport_options": transport,
        "result_backend_transport_options": transport,
        "visibility_timeout": settings.visibility_timeout_s,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "broker_connection_retry_on_startup": True,
        "task_default_queue": "gpu",
        "worker_hijack_root_logger": False,
        # Prefork with a warm spare process and prompt replacement of each trial's process.
        "worker_pool": "trialq.pool:TrialPool",
    }


def create_app(settings: Settings) -> Celery:
    """A Celery app bound to the settings' broker and result backend."""
    celery_app = Celery("trialq", broker=settings.broker_url, backend=settings.backend_url)
    celery_app.conf.update(celery_config(settings))
    celery_app.conf.trialq_settings = settings
    return celery_app
