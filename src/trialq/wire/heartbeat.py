"""Worker heartbeats: a key with a TTL per live worker, and one per trial it is running.

A worker whose key expired is gone, whatever the broker believes; its trial is lost. The
same keys serve `trialq health` (a container's liveness probe) and `trialq status`.
The worker's parent writes its own key; each trial process writes its trial's key (the
parent does not know which trial its child runs), under a prefix of its own so that older
readers of the worker keys never meet a value they cannot parse. A worker that owns GPUs
beats their model, memory and its trial slots too (`GpuBeat`), under a key of their own
beside its heartbeat for the same reason; the driver routes by them (`trialq.wire.routing`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import redis

from trialq.wire.keys import (
    RUNNING_PREFIX,
    WORKER_PREFIX,
    attempt_key,
    kill_key,
    running_key,
    worker_gpus_key,
    worker_key,
)
from trialq.wire.queue_running import QueueClaim


@dataclass(frozen=True)
class GpuBeat:
    """A worker's GPUs and the trial slots it cut them into, as it publishes them."""

    devices: tuple[str, ...]
    model: str
    total_bytes: int
    """Each GPU's memory (the smallest, where they differ)."""
    slots: int
    gpus_per_slot: int
    slot_budget_bytes: int | None
    """What one trial may hold on each of its GPUs; None: the whole GPU."""
    processes: str | None = None
    """What NVML's process list can be trusted for on the worker's host, as its start probe
    found (`trialq.gpu.attribution.ProcessView`'s value); None: not probed."""

    def describe(self) -> str:
        """`2 x NVIDIA H100 80GB HBM3 (79.6 GiB), 8 slots of 1 GPU x 19.4 GiB, NVML
        processes: pids`."""
        budget = "the whole GPU" if self.slot_budget_bytes is None else _gib(self.slot_budget_bytes)
        found = "" if self.processes is None else f", NVML processes: {self.processes}"
        return (
            f"{len(self.devices)} x {self.model} ({_gib(self.total_bytes)}), {self.slots} slots "
            f"of {self.gpus_per_slot} GPU x {budget}{found}"
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GpuBeat:
        """A beat as read back, fields a newer worker added left out."""
        known = {f.name for f in fields(cls)} & set(data)
        return cls(**{**{k: data[k] for k in known}, "devices": tuple(data["devices"])})


@dataclass(frozen=True)
class WorkerBeat:
    """What a live worker says of itself."""

    name: str
    host: str
    pid: int
    queues: tuple[str, ...]
    gpu: str | None
    beat_at: float
    gpus: GpuBeat | None = None
    """Its GPUs and slots, where it owns GPUs (`trialq worker --gpus`): kept under a key of
    their own, never in the heartbeat's value."""

    @classmethod
    def from_json(cls, data: dict[str, Any], gpus: GpuBeat | None = None) -> WorkerBeat:
        """A beat as read back, fields a newer worker added left out."""
        known = {f.name for f in fields(cls)} - {"gpus"}
        values = {k: data[k] for k in known & set(data)}
        return cls(**{**values, "queues": tuple(data["queues"])}, gpus=gpus)

    def heartbeat_json(self) -> dict[str, Any]:
        """The heartbeat's value: what every reader of it, older ones too, can parse."""
        return {k: v for k, v in asdict(self).items() if k != "gpus"}


_log = logging.getLogger("trialq.worker")


class _RenewedKey:
    """A Redis key with a TTL, rewritten every `interval_s` from a daemon thread and deleted
    on `stop`. Redis being away for a while leaves the TTL to decide, not the thread."""

    def __init__(self, client: redis.Redis, interval_s: float, ttl_s: float, name: str) -> None:
        self._client = client
        self._interval_s = interval_s
        self._ttl_ms = int(ttl_s * 1000)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _key(self) -> str:
        raise NotImplementedError

    def _value(self) -> str:
        raise NotImplementedError

    def _write(self) -> None:
        self._client.set(self._key(), self._value(), px=self._ttl_ms)

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            with contextlib.suppress(redis.RedisError):
                self._write()

    def stop(self) -> None:
        """Stop renewing and delete the key (where Redis is away, the TTL removes it)."""
        self._stopped.set()
        self._thread.join(timeout=self._interval_s + 1)
        with contextlib.suppress(redis.RedisError):
            self._client.delete(self._key())


class Heartbeat(_RenewedKey):
    """Writes one worker's key every `interval_s` from a daemon thread of the worker's parent.

    `stop` removes it: a clean exit is not a lost worker.
    """

    def __init__(
        self,
        client: redis.Redis,
        beat: WorkerBeat,
        interval_s: float,
        ttl_s: float,
        mark: Path | None = None,
    ) -> None:
        """`mark`: a file touched after each beat that reached Redis, so a container health
        check can read its age with no Python and no round trip (`TRIALQ_HEARTBEAT_FILE`)."""
        super().__init__(client, interval_s, ttl_s, "trialq-heartbeat")
        self._beat = beat
        self._mark = mark
        self._beats = 0
        self.twin: str | None = None
        """Another worker beating under this one's name, once seen (said once)."""

    def _write(self) -> None:
        # Both keys in one transaction: a reader never finds the worker without its GPUs.
        pipe = self._client.pipeline()
        if self._beat.gpus is not None:
            gpus = json.dumps(asdict(self._beat.gpus))
            pipe.set(worker_gpus_key(self._beat.name), gpus, px=self._ttl_ms)
        pipe.get(self._key())
        pipe.set(self._key(), self._value(), px=self._ttl_ms)
        previous = pipe.execute()[-2]
        self._beats += 1
        if self._beats > 1 and self.twin is None:  # the first may find a dead predecessor's
            self._notice_a_twin(previous)
        if self._mark is not None:
            self._mark.touch()

    def _notice_a_twin(self, previous: bytes | str | None) -> None:
        """Say, once, that another live worker wrote this name's heartbeat since the last
        beat: its twin keeps the key fresh, so neither's loss is ever seen, and their trials
        would be waited for forever."""
        try:
            other = json.loads(previous) if previous is not None else None
        except ValueError:
            return
        if not isinstance(other, dict):
            return
        if (other.get("host"), other.get("pid")) == (self._beat.host, self._beat.pid):
            return
        self.twin = f"host {other.get('host')}, pid {other.get('pid')}"
        _log.error(
            "another worker beats under this worker's name %r (%s): a lost worker of the two "
            "is never seen, its trial waited for forever; give each worker its own --hostname",
            self._beat.name, self.twin,
        )  # fmt: skip

    def stop(self) -> None:
        """Stop beating and delete the heartbeat and the GPUs' key."""
        super().stop()
        with contextlib.suppress(redis.RedisError):
            self._client.delete(worker_gpus_key(self._beat.name))

    def start(self) -> None:
        """Beat once now (so readiness is immediate; a Redis error here is raised), then keep
        beating."""
        self._write()
        self._thread.start()

    def _key(self) -> str:
        return worker_key(self._beat.name)

    def _value(self) -> str:
        return json.dumps(self._beat.heartbeat_json() | {"beat_at": time.time()})


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
        return running_key(self.worker, self.pid)


class TrialBeacon(_RenewedKey):
    """The running trial's key, renewed from a daemon thread of the trial process.

    The key lives one heartbeat TTL past its last renewal: a trial process killed outright
    (SIGKILL, the OOM killer, a hard time limit) stops claiming its trial that soon after,
    and a clean end (`stop`) deletes it at once. Redis being away only leaves a gap in
    `status`. Each renewal also reads the attempt's kill mark (`kill_key`): once the driver
    has given up on the attempt, `on_kill` ends the process (and what it started). With a
    `claim`, each renewal renews the trial's place in its queue's running count too
    (`trialq.wire.queue_running`, what an autoscaler reads), and `stop` removes it.
    """

    def __init__(
        self,
        client: redis.Redis,
        trial: RunningTrial,
        interval_s: float,
        ttl_s: float,
        on_kill: Callable[[], object] | None = None,
        claim: QueueClaim | None = None,
        log_file: str | None = None,
    ) -> None:
        """`log_file`: the attempt's own log, named in the attempt key's value so the driver
        can name it for an attempt that ends with no result of its own (`AttemptBeacon`)."""
        super().__init__(client, interval_s, ttl_s, "trialq-beacon")
        self._trial = trial
        self._on_kill = on_kill
        self._claim = claim
        self._attempt_value = AttemptBeacon(trial.pid, log_file).value()

    def start(self) -> TrialBeacon:
        """Claim the trial now, then keep claiming it."""
        with contextlib.suppress(redis.RedisError):
            self._write()
        self._thread.start()
        return self

    def _key(self) -> str:
        return self._trial.key

    def _value(self) -> str:
        return json.dumps(asdict(self._trial))

    def _write(self) -> None:
        """Claim the trial for `status`, say its attempt lives (`attempt_alive`), and end the
        process if the driver gave up on the attempt."""
        pipe = self._client.pipeline(transaction=False)
        pipe.set(self._key(), self._value(), px=self._ttl_ms)
        pipe.set(attempt_key(self._trial.task_id), self._attempt_value, px=self._ttl_ms)
        if self._claim is not None:
            self._claim.renew(pipe, self._ttl_ms)
        pipe.exists(kill_key(self._trial.task_id))
        *_, killed = pipe.execute()
        if killed and self._on_kill is not None:
            self._on_kill()

    def stop(self, returned: bool = True) -> None:
        """Stop claiming the trial. `returned`: the attempt's task returned, its word stored,
        so the attempt key goes at once; a process unwinding without one (the trial called
        `sys.exit`) leaves it to its TTL, so the driver hears the pool's word on the exit
        (`crashed: exitcode 0`) before it could take the attempt for a lost worker's."""
        super().stop()
        with contextlib.suppress(redis.RedisError):
            if returned:
                self._client.delete(attempt_key(self._trial.task_id))
            if self._claim is not None:
                self._claim.release(self._client)


@dataclass(frozen=True)
class AttemptBeacon:
    """What an attempt key holds: its process's pid, and with a log of its own, that file.
    A bare pid where there is no file: what drivers before the file was named wrote and
    read (they only ask whether the key exists)."""

    pid: int
    log_file: str | None = None

    def value(self) -> str:
        if self.log_file is None:
            return str(self.pid)
        return json.dumps({"pid": self.pid, "log_file": self.log_file})

    @classmethod
    def read(cls, raw: bytes | str | None) -> AttemptBeacon | None:
        """The value as written (None for no key, or one this version cannot read)."""
        if raw is None:
            return None
        text = raw.decode() if isinstance(raw, bytes) else raw
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if isinstance(data, int):
            return cls(data)
        if isinstance(data, dict) and isinstance(data.get("pid"), int):
            log_file = data.get("log_file")
            return cls(data["pid"], log_file if isinstance(log_file, str) else None)
        return None


def attempt_alive(client: redis.Redis, task_id: str) -> bool:
    """Whether the trial process running attempt `task_id` still beats."""
    return bool(client.exists(attempt_key(task_id)))


def running_trials(client: redis.Redis) -> list[RunningTrial]:
    """Every trial whose process still claims it, by worker name then pid."""
    return [RunningTrial(**data) for data in _live_values(client, RUNNING_PREFIX)]


def live_workers(client: redis.Redis) -> list[WorkerBeat]:
    """Every worker whose heartbeat has not expired, with its GPUs where it beats them."""
    beats = _live_values(client, WORKER_PREFIX)
    if not beats:
        return []
    gpus = client.mget([worker_gpus_key(data["name"]) for data in beats])
    return [
        WorkerBeat.from_json(data, GpuBeat.from_json(json.loads(raw)) if raw else None)
        for data, raw in zip(beats, gpus, strict=True)
    ]


def _live_values(client: redis.Redis, prefix: str) -> list[dict[str, Any]]:
    """The JSON under every unexpired key with `prefix`, in key order."""
    keys = sorted(client.scan_iter(match=prefix + "*", count=500))
    if not keys:
        return []
    return [json.loads(raw) for raw in client.mget(keys) if raw is not None]


def twin_beating(
    client: redis.Redis,
    name: str,
    within_s: float,
    me: tuple[str, int] = (socket.gethostname(), 0),
    poll_s: float = 0.25,
) -> WorkerBeat | None:
    """Another live worker's heartbeat under `name`: one renewed within `within_s` (a live
    worker rewrites it every interval) by a process other than `me` (host, pid). None where
    no key is there, or it stays as it was (a dead predecessor's, left to its TTL): a worker
    restarted under its fixed name waits that long at most, and only then."""
    first = client.get(worker_key(name))
    deadline = time.monotonic() + within_s
    while first is not None and time.monotonic() < deadline:
        time.sleep(poll_s)
        now = client.get(worker_key(name))
        if now is None:
            return None
        if now != first:
            beat = WorkerBeat.from_json(json.loads(now))
            return None if (beat.host, beat.pid) == me else beat
    return None


def is_alive(client: redis.Redis, worker_name: str) -> bool:
    """Whether the named worker (Celery's nodename) still beats."""
    return bool(client.exists(worker_key(worker_name)))


def local_worker_alive(client: redis.Redis, max_age_s: float | None = None) -> bool:
    """Whether a worker on this host beats (and, with max_age_s, beat that recently)."""
    host = socket.gethostname()
    now = time.time()
    return any(
        beat.host == host and (max_age_s is None or now - beat.beat_at <= max_age_s)
        for beat in live_workers(client)
    )


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f} GiB"
