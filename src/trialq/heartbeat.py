"""Worker heartbeats: a key with a TTL per live worker, and the trial it is running.

A worker whose key expired is gone, whatever the broker believes; its trial is lost. The
same keys serve `trialq health` (a container's liveness probe) and `trialq status`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from dataclasses import asdict, dataclass

import redis

_PREFIX = "trialq:worker:"


@dataclass(frozen=True)
class WorkerBeat:
    """What a live worker says of itself."""

    name: str
    host: str
    pid: int
    queues: tuple[str, ...]
    gpu: str | None
    beat_at: float


class Heartbeat:
    """Writes one worker's key every `interval_s` from a daemon thread of the worker's parent."""

    def __init__(
        self, client: redis.Redis, beat: WorkerBeat, interval_s: float, ttl_s: float
    ) -> None:
        self._client = client
        self._beat = beat
        self._interval_s = interval_s
        self._ttl_ms = int(ttl_s * 1000)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trialq-heartbeat", daemon=True)

    def start(self) -> None:
        """Beat once now (so readiness is immediate), then keep beating."""
        self._write()
        self._thread.start()

    def stop(self) -> None:
        """Stop beating and remove the key: a clean exit is not a lost worker."""
        self._stopped.set()
        self._thread.join(timeout=self._interval_s + 1)
        with contextlib.suppress(redis.RedisError):  # Redis away: the TTL removes it
            self._client.delete(_PREFIX + self._beat.name)

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                self._write()
            except redis.RedisError:
                continue  # Redis away for a moment: the TTL decides, not this thread

    def _write(self) -> None:
        beat = WorkerBeat(**{**asdict(self._beat), "beat_at": time.time()})
        self._client.set(_PREFIX + beat.name, json.dumps(asdict(beat)), px=self._ttl_ms)


def live_workers(client: redis.Redis) -> list[WorkerBeat]:
    """Every worker whose heartbeat has not expired."""
    names = sorted(client.scan_iter(match=_PREFIX + "*", count=500))
    if not names:
        return []
    beats = []
    for raw in client.mget(names):
        if raw is not None:
            data = json.loads(raw)
            beats.append(WorkerBeat(**{**data, "queues": tuple(data["queues"])}))
    return beats


def is_alive(client: redis.Redis, worker_name: str) -> bool:
    """Whether the named worker (Celery's nodename) still beats."""
    return bool(client.exists(_PREFIX + worker_name))


def local_worker_alive(client: redis.Redis, max_age_s: float | None = None) -> bool:
    """Whether a worker on this host beats (and, with max_age_s, beat that recently)."""
    host = socket.gethostname()
    now = time.time()
    return any(
        beat.host == host and (max_age_s is None or now - beat.beat_at <= max_age_s)
        for beat in live_workers(client)
    )
