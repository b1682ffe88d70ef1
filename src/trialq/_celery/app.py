"""The Celery app and the settings that carry the design (docs/design.md), shared by both ends.

Creating an app touches no network and no GPU; the driver makes one to send tasks, the
worker's edge (`trialq._celery.worker`) the one its worker runs.
"""

from __future__ import annotations

import ssl
from typing import Any

from celery import Celery

from trialq._celery.backend import backend_for
from trialq.settings import Settings
from trialq.wire.keys import DEFAULT_QUEUE

TASK_NAME = "trialq.run_trial"


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery settings that make one-process-per-trial safe (docs/design.md)."""
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
        "result_expires": settings.key_ttl_s,
        "broker_transport_options": transport,
        "result_backend_transport_options": transport,
        "visibility_timeout": settings.visibility_timeout_s,
        # A Redis blip must not kill a trial hours into training: it goes on, its result is
        # stored when Redis is back, and a redelivery of a finished trial is not run again.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "result_backend_always_retry": True,
        "result_backend_max_retries": 30,
        "broker_connection_retry_on_startup": True,
        "task_default_queue": DEFAULT_QUEUE,
        # Flower (and `celery events`) see every trial, also one that started before they did.
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "worker_hijack_root_logger": False,
        # A trial's print() is its own output, not a warning: INFO, with the trial's ids.
        "worker_redirect_stdouts_level": "INFO",
        # Prefork with a warm spare process and prompt replacement of each trial's process.
        "worker_pool": "trialq._celery.pool:TrialPool",
    }


TRANSPORT = "trialq._celery.transport:TrialRedisTransport"
"""kombu's Redis transport, setting malformed queue entries aside (`trialq._celery.transport`)."""


def _transport(settings: Settings) -> dict[str, Any]:
    """trialq's own transport for a Redis broker URL; any other is left to kombu."""
    if settings.broker_url.split("://", 1)[0] in ("redis", "rediss"):
        return {"broker_transport": TRANSPORT}
    return {}


def _tls_defaults(settings: Settings) -> dict[str, Any]:
    """Verified TLS for `rediss://` URLs that do not say otherwise.

    Celery refuses a `rediss://` URL without `ssl_cert_reqs`; trialq takes the safe
    reading (verify the server's certificate), as redis-py does for the same URL.
    """
    verified = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    config: dict[str, Any] = {}
    if _needs_tls_default(settings.broker_url):
        config["broker_use_ssl"] = verified
    if _needs_tls_default(settings.backend_url):
        config["redis_backend_use_ssl"] = verified
    return config


def _needs_tls_default(url: str) -> bool:
    return url.startswith("rediss://") and "ssl_cert_reqs" not in url


def create_app(settings: Settings) -> Celery:
    """A Celery app bound to the settings' broker and result backend."""
    backend = backend_for(settings.backend_url)
    celery_app = Celery("trialq", broker=settings.broker_url, backend=backend)
    celery_app.conf.update(celery_config(settings))
    celery_app.conf.update(_transport(settings))
    celery_app.conf.update(_tls_defaults(settings))
    return celery_app
