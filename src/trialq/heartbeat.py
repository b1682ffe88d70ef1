"""Worker heartbeats: a key with a TTL per live worker, and one per trial it is running.

A worker whose key expired is gone, whatever the broker believes; its trial is lost. The
same keys serve `trialq health` (a container's liveness probe) and `trialq status`.
The worker's parent writes its own key; each trial process writes its trial's key (the
parent does not know which trial its child runs), under a prefix of its own so that older
readers of the worker keys never meet a value they cannot parse.
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
_RUNNING_PREFIX = "trialq:running:"


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


@dataclass(frozen=True)
class RunningTrial:
    """What a trial process says it is running, and since when."""

    worker: str
    study: str
    number: int
    attempt: int
    task_id: str
    pid: int
    started_at: float

    @property
    def key(self) -> str:
        """One key per trial process: a worker with concurrency N runs N at once."""
        return f"{_RUNNING_PREFIX}{self.worker}:{self.pid}"


class TrialBeacon:
    """The running trial's key, renewed from a daemon thread of the trial process.

    The key lives one heartbeat TTL past its last renewal: a trial process killed outright
    (SIGKILL, the OOM killer, a hard time limit) stops claiming its trial that soon after,
    and a clean end deletes it at once. Redis being away only leaves a gap in `status`.
    """

    def __init__(
        self, client: redis.Redis, trial: RunningTrial, interval_s: float, ttl_s: float
    ) -> None:
        self._client = client
        self._trial = trial
        self._interval_s = interval_s
        self._ttl_ms = int(ttl_s * 1000)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trialq-beacon", daemon=True)

    def start(self) -> TrialBeacon:
        """Claim the trial now, then keep claiming it."""
        self._write()
        self._thread.start()
        return self

    def stop(self) -> None:
        """The trial is over: stop renewing and delete the key."""
        self._stopped.set()
        self._thread.join(timeout=self._interval_s + 1)
        with contextlib.suppress(redis.RedisError):
            self._client.delete(self._trial.key)

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            self._write()

    def _write(self) -> None:
        with contextlib.suppress(redis.RedisError):
            self._client.set(self._trial.key, json.dumps(asdict(self._trial)), px=self._ttl_ms)


def running_trials(client: redis.Redis) -> list[RunningTrial]:
    """Every trial whose process still claims it, by worker name then pid."""
    keys = sorted(client.scan_iter(match=_RUNNING_PREFIX + "*", count=500))
    if not keys:
        return []
    return [RunningTrial(**json.loads(raw)) for raw in client.mget(keys) if raw is not None]


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
