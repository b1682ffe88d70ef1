"""`trialq worker`: Celery's worker started in this process, its command line built here.

The flags that carry the design (one trial per process, one message reserved at a time) are
read from the app's own settings (`celery_config`), so the command line and the app never
disagree. Celery is imported only once the preload has passed: a refused preload is one line
and exit code 2, before any of Celery starts.

A worker that owns GPUs (`--gpus`) runs one trial per slot: its concurrency is its number of
slots, and it consumes its queue and each GPU class its slots fit (`trialq.wire.routing`).
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from trialq.errors import WorkerNameTaken
from trialq.gpu.share import GpuShare
from trialq.settings import Settings
from trialq.wire.heartbeat import twin_beating
from trialq.wire.routing import slot_queues
from trialq.worker.prewarm import preload_for

WITHOUT = ("--without-mingle", "--without-gossip")
"""Celery's start-up steps a trialq worker does without. Mingle asks the other workers for
the tasks they saw revoked and waits a second for answers, at every start (1.07 s of a
`--local` worker's start here); trialq never relies on revokes reaching a worker that was
not up (a withdrawn task carries a durable mark, `keys.withdrawn_key`). Gossip has each
worker follow the others' events, which nothing in trialq reads."""


def default_worker_name() -> str:
    """`trialq-PID-XXXX@HOST`, new at every start. The driver takes a trial whose worker stopped
    beating for lost; a worker restarted in its container gets the same pid and host, and
    under the same name it would look alive, so the trial its last life ran would wait forever."""
    return f"trialq-{os.getpid()}-{secrets.token_hex(2)}@%h"


@dataclass(frozen=True)
class WorkerOptions:
    """What `trialq worker` was asked for; `extra` (flags the user gave that trialq does not
    know) goes to Celery last."""

    queue: str
    concurrency: int
    hostname: str | None
    loglevel: str
    extra: Sequence[str] = ()
    queues: tuple[str, ...] = ()
    """Every queue consumed; empty: `queue` alone."""

    def for_slots(self, shares: tuple[GpuShare, ...]) -> WorkerOptions:
        """One trial per slot, from the queues its slots fit (unchanged without slots)."""
        if not shares:
            return self
        budget, gpus = shares[0].budget_bytes, len(shares[0].devices)
        queues = slot_queues(self.queue, gpus, budget)
        return replace(self, concurrency=len(shares), queues=queues)


def worker_argv(settings: Settings, options: WorkerOptions) -> list[str]:
    """Celery's command line for a trialq worker."""
    from trialq._celery.app import celery_config

    config = celery_config(settings)
    return [
        "--quiet",  # no banner: kombu's shows `redis://:**@` for a URL with no password
        "worker",
        "--queues", ",".join(options.queues or (options.queue,)),
        "--concurrency", str(options.concurrency),
        "--max-tasks-per-child", str(config["worker_max_tasks_per_child"]),
        "--prefetch-multiplier", str(config["worker_prefetch_multiplier"]),
        "--hostname", options.hostname or default_worker_name(),
        "--loglevel", options.loglevel,
        *WITHOUT,
        *options.extra,
    ]  # fmt: skip


def run_worker(settings: Settings, options: WorkerOptions) -> int:
    """Preload, then run Celery's worker in this process, on the app built from `settings`,
    until it stops; its exit status."""
    preload_for(settings.preload, settings.preload_from, settings.import_paths)  # refused: exit 2
    if options.hostname is not None:  # the default name is new at every start
        refuse_a_twin(settings, options.hostname)
    from trialq._celery.worker import build_worker_app
    from trialq.worker.state import WorkerState

    state = WorkerState(settings)
    app = build_worker_app(state)
    return run_celery(app, worker_argv(settings, options.for_slots(state.plan_gpus())))


def refuse_a_twin(settings: Settings, hostname: str) -> None:
    """Refuse to start under a name another live worker beats as (`WorkerNameTaken`: one
    line, exit code 2): two workers of one name share one heartbeat, and the driver would not
    see either lost while the other lives. A dead predecessor's heartbeat,
    left to its TTL, is waited out for two intervals at most. A broker that does not answer
    is left to the worker's own start to report."""
    import redis
    from celery.utils.nodenames import default_nodename, host_format

    name = host_format(default_nodename(hostname))
    within_s = min(settings.heartbeat_ttl_s, 2 * settings.heartbeat_interval_s) + 1.0
    client = redis.Redis.from_url(settings.broker_url, socket_timeout=5, socket_connect_timeout=5)
    try:
        twin = twin_beating(client, name, within_s, me=(socket.gethostname(), os.getpid()))
    except redis.RedisError:
        return
    finally:
        client.close()
    if twin is not None:
        raise WorkerNameTaken(
            f"trialq worker: another worker beats as {name!r} (host {twin.host}, pid "
            f"{twin.pid}): give each worker its own --hostname, or leave it out"
        )


def run_celery(app: Any, argv: list[str]) -> int:
    """Celery's own command on `argv`, running `app` (handed to it as Celery's `app.start`
    does: the default of its `--app` option); its exit status, which `app.start` drops."""
    from celery.bin.celery import celery as celery_command

    app_option = next(param for param in celery_command.params if param.name == "app")
    app_option.default = app
    try:
        status = celery_command.main(args=argv, standalone_mode=False)
    finally:
        app_option.default = None
    return status if isinstance(status, int) else 0
