"""The Celery edge on the driver side: sending trials and reading their fate from Redis.

Redis's errors stay here: what the driver meets is trialq's (`_broker_errors`): a lost
connection or a timeout is `BrokerUnreachable`, which the driver rides out as an outage; any
other refusal is `BrokerError`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import redis
from celery import Celery
from kombu.exceptions import OperationalError
from pydantic import ValidationError

from trialq._celery.app import TASK_NAME, create_app
from trialq.errors import BrokerError, BrokerUnreachable
from trialq.settings import Settings
from trialq.wire import carried_code, heartbeat
from trialq.wire.broker_away import broker_away
from trialq.wire.channel import Report, ReportChannel, TrialAddress
from trialq.wire.dispatch import TaskPhase, TaskStatus
from trialq.wire.keys import (
    KOMBU_UNACKED,
    KOMBU_UNACKED_INDEX,
    attempt_key,
    kill_key,
    kombu_queue_key,
    result_key,
    results_channel,
    withdrawn_key,
)
from trialq.wire.messages import Outcome, TrialRequest, TrialResult
from trialq.wire.signing import Seal, stored_result_refusal
from trialq.wire.suggest import QuestionChannel

_log = logging.getLogger("trialq.driver")  # the loop's name: log lines read as before

_FAILURE_OUTCOMES = {
    # Recorded by the worker's parent, alive, on seeing its trial process end with no result
    # (a signal, sys.exit, os._exit): the trial's own end. A worker that is lost records
    # nothing; the driver finds it by its heartbeat.
    "WorkerLostError": Outcome.CRASHED,
    "TimeLimitExceeded": Outcome.TIMEOUT,
    "SoftTimeLimitExceeded": Outcome.TIMEOUT,
}
_PENDING_IDS_LUA = """
local ids = {}
local now, stale_after = tonumber(ARGV[1]), tonumber(ARGV[2])
local function add(message)
  if type(message) == 'table' and type(message.headers) == 'table'
      and type(message.headers.id) == 'string' then
    ids[#ids + 1] = message.headers.id
  end
end
for _, raw in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  local ok, message = pcall(cjson.decode, raw)
  if ok then add(message) end
end
local held = redis.call('HGETALL', KEYS[2])
for i = 1, #held, 2 do
  local reserved = tonumber(redis.call('ZSCORE', KEYS[3], held[i]))
  if reserved == nil or now - reserved < stale_after then
    local ok, entry = pcall(cjson.decode, held[i + 1])
    if ok and type(entry) == 'table' then add(entry[1]) end
  end
end
return ids
"""
"""`pending_ids` on the server: kombu's queue list holds messages, its `unacked` hash
`[message, exchange, routing key]` by delivery tag, `unacked_index` when each was reserved;
an entry that is no message of Celery's is skipped."""

RESERVED_UNSTARTED_S = 60.0
"""A message reserved this long with no start stored is not pending: its worker lost the
reservation (its connection dropped, a Redis restart) and kombu would hand it out again only
after the visibility timeout (12 h). A worker reserves no more than its free trial slots and
stores `STARTED` as its process takes the message, so a live reservation is far younger."""

_METAS_KEPT = 100_000
"""The most decoded metas kept: far above any number in flight; past it (attempts resent,
never forgotten) the cache starts again."""
_WITHDRAWN = "TaskRevokedError"  # only a driver revokes: withdrawn, or killed for its pruner


class CeleryDispatcher:
    """Sends `trialq.run_trial` tasks and reads results, starts and losses from Redis."""

    def __init__(self, settings: Settings, app: Celery | None = None) -> None:
        self._app = app or create_app(settings)
        self._broker = redis.Redis.from_url(settings.broker_url, socket_timeout=10)
        self._backend = self._app.backend
        # The driver reads results itself (`statuses`), never through an AsyncResult: Celery's
        # subscription to each task's meta channel, made at every send and dropped when the
        # AsyncResult is collected, is two round trips a trial for nothing (a
        # driver far from its Redis).
        self._backend.on_task_call = _reads_results_itself
        self._metas_on_broker = settings.backend_url == settings.broker_url
        """Celery's task metas live in the broker's Redis: one round trip reads them with
        trialq's own results."""
        self._key_ttl_s = settings.key_ttl_s
        self._metas_read: dict[str, tuple[Any, Any]] = {}
        """Each task's meta as last read, and decoded: the next read decodes only a new one.
        A task's entry goes when its results are forgotten."""
        self._seal = settings.seal
        self._results = TrustedResults(settings.seal)
        self._announcements = ResultAnnouncements(self._broker)
        self._pending_ids_script = self._broker.register_script(_PENDING_IDS_LUA)

    def check_reachable(self) -> None:
        """Raise `BrokerUnreachable` unless Redis answers a PING."""
        try:
            self._broker.ping()
        except redis.RedisError as exc:
            raise BrokerUnreachable(f"broker unreachable: {_without_password(exc)}") from None

    def submit(self, request: TrialRequest, queue: str, task_id: str | None = None) -> str:
        """Publish the request, signed for its task id with the deployment's secret where
        there is one, on the queue with its hard time limit. Its soft limit is the
        trial process's own, counted from when the trial's code starts
        (`trialq.trial.soft_limit`): Celery's counts the waits on Redis before it too."""
        task_id = task_id or str(uuid.uuid4())
        self._announcements.listen(request.study)  # before the send: none is missed
        payload = _sealed(request, self._seal).model_dump(mode="json", exclude={"signature"})
        if self._seal is not None:
            payload = self._seal.sign_task(task_id, payload)
        try:
            self._app.send_task(
                TASK_NAME,
                args=[payload],
                task_id=task_id,
                queue=queue,
                time_limit=request.hard_limit_s,
            )
        except (OperationalError, redis.RedisError) as exc:
            raise BrokerUnreachable(f"cannot send a trial: {_without_password(exc)}") from None
        return task_id

    def statuses(self, task_ids: Iterable[str]) -> dict[str, TaskStatus]:
        """Every task's state: trialq's own result where the trial wrote one, else Celery's
        meta; with each attempt's beacon (`TaskStatus.beating`). One round trip, whatever the
        number of tasks, where the metas are on the broker's Redis (the default)."""
        ids = list(task_ids)
        if not ids:
            return {}
        with _broker_errors("reading statuses"):
            return self._statuses(ids)

    def _statuses(self, ids: list[str]) -> dict[str, TaskStatus]:
        result_keys = [result_key(task_id) for task_id in ids]
        meta_keys = [self._backend.get_key_for_task(task_id) for task_id in ids]
        beacon_keys = [attempt_key(task_id) for task_id in ids]
        pipe = self._broker.pipeline(transaction=False)
        pipe.mget(result_keys)
        pipe.mget(beacon_keys)
        if self._metas_on_broker:
            pipe.mget(meta_keys)
            results, beacons, metas = pipe.execute()
        else:
            (results, beacons), metas = pipe.execute(), self._backend.mget(meta_keys)
        read = zip(ids, results, metas, beacons, strict=True)
        if len(self._metas_read) > _METAS_KEPT:  # ids of attempts never forgotten (resent)
            self._metas_read = {}
        return {
            task_id: _with_log_file(
                self._status(task_id, result, meta, beating=beacon is not None), beacon
            )
            for task_id, result, meta, beacon in read
        }

    def _status(
        self,
        task_id: str,
        result: Any,
        raw_meta: Any,
        beating: bool,
    ) -> TaskStatus:
        """One task's state: its own result where one verifies, else Celery's meta, whose
        `SUCCESS` must verify too. A result set aside counts as none: the attempt runs on
        (its real result still counts), or, its process gone, is an attempt lost."""
        trusted = self._results.trusted(task_id, result) if result is not None else None
        if trusted is not None:
            return TaskStatus(TaskPhase.FINISHED, result=trusted, beating=beating)
        meta = self._meta(task_id, raw_meta)
        if meta is None or meta.get("status") != "SUCCESS":
            return replace(_status(meta), beating=beating)
        trusted = self._results.trusted(task_id, meta.get("result"))
        if trusted is not None:
            return TaskStatus(TaskPhase.FINISHED, result=trusted, beating=beating)
        if beating:
            return TaskStatus(TaskPhase.RUNNING, beating=True)
        detail = f"its result was set aside ({self._results.refusals.get(task_id)})"
        return TaskStatus(TaskPhase.FAILED, failure=Outcome.WORKER_LOST, detail=detail)

    def _meta(self, task_id: str, raw: Any) -> Any:
        """Celery's meta, decoded only where it changed since the last read (a pass reads
        every trial in flight now and then, and most of them still run)."""
        last = self._metas_read.get(task_id)
        if last is not None and last[0] == raw:
            return last[1]
        meta = None if raw is None else self._backend.decode_result(raw)
        self._metas_read[task_id] = (raw, meta)
        return meta

    def pending_ids(self, queue: str) -> set[str]:
        """Ids of the queue's waiting messages and of every reserved (unacked) one younger
        than `RESERVED_UNSTARTED_S`: read on the server, in one round trip that carries ids,
        not the messages (a driver far from its Redis spent a third of its time on them); by
        hand where scripts are refused."""
        with _broker_errors("listing the queue"):
            return self._pending_ids(queue)

    def _pending_ids(self, queue: str) -> set[str]:
        keys = [kombu_queue_key(queue), KOMBU_UNACKED, KOMBU_UNACKED_INDEX]
        now = time.time()
        try:
            found: list[bytes] = self._pending_ids_script(
                keys=keys, args=[now, RESERVED_UNSTARTED_S]
            )
            return {raw.decode() for raw in found}
        except redis.exceptions.ResponseError:  # no EVAL here (some managed Redis)
            pass
        ids = {_message_id(raw) for raw in self._broker.lrange(kombu_queue_key(queue), 0, -1)}
        index: Any = self._broker.zrange(KOMBU_UNACKED_INDEX, 0, -1, withscores=True)
        reserved_at = {tag: float(score) for tag, score in index}
        for tag, raw in self._broker.hgetall(KOMBU_UNACKED).items():
            if now - reserved_at.get(tag, now) < RESERVED_UNSTARTED_S:
                ids.add(_message_id(json.loads(raw)[0]))
        ids.discard(None)
        return ids  # type: ignore[return-value]

    def worker_alive(self, worker: str) -> bool:
        """Whether the worker's heartbeat key is still there."""
        with _broker_errors("reading a heartbeat"):
            return heartbeat.is_alive(self._broker, worker)

    def attempt_alive(self, task_id: str) -> bool:
        """Whether the attempt's trial process still renews its beacon, asked now (`statuses`
        reads every beacon with the statuses, in the same round trip)."""
        with _broker_errors("reading a beacon"):
            return heartbeat.attempt_alive(self._broker, task_id)

    def withdraw(self, task_ids: Iterable[str], queue: str) -> None:
        """Mark tasks withdrawn (durably), revoke them, and drop their queued messages."""
        ids = set(task_ids)
        if not ids:
            return
        with _broker_errors("withdrawing trials"):
            self._withdraw(ids, queue)

    def _withdraw(self, ids: set[str], queue: str) -> None:
        pipe = self._broker.pipeline(transaction=False)
        for task_id in ids:
            pipe.set(withdrawn_key(task_id), 1, ex=self._key_ttl_s)
        pipe.execute()
        self._app.control.revoke(list(ids))
        queued: list[Any] = self._broker.lrange(kombu_queue_key(queue), 0, -1)
        for raw in queued:
            if _message_id(raw) in ids:
                self._broker.lrem(kombu_queue_key(queue), 1, raw)

    def terminate(self, task_id: str) -> None:
        """Revoke a running task and kill its process (SIGKILL: the GPU is freed at once).

        Celery's revoke reaches the process only through its worker's parent, alive and
        connected; the kill mark reaches it through its own beacon, at its next renewal,
        however its parent fares (a frozen parent, a host cut off and back)."""
        with _broker_errors("killing a trial"):
            pipe = self._broker.pipeline(transaction=False)
            pipe.set(withdrawn_key(task_id), 1, ex=self._key_ttl_s)
            pipe.set(kill_key(task_id), 1, ex=self._key_ttl_s)
            pipe.execute()
            self._app.control.revoke(task_id, terminate=True, signal="SIGKILL")

    def forget_results(self, task_ids: Iterable[str]) -> None:
        """Delete trialq's result and Celery's task meta of each attempt. One whose message
        kombu still holds reserved (a worker lost before it acknowledged) is marked withdrawn:
        handed out again after the visibility timeout, it finds the mark and is not run,
        where it found no result and ran the whole trial again. Only those: a told trial
        leaves no key behind. The key TTL (`TRIALQ_KEY_TTL_S`) stays the safety net for what
        a driver never forgets (it died, or gave up on an attempt whose process may still
        write)."""
        ids = list(task_ids)
        if not ids:
            return
        for task_id in ids:
            self._metas_read.pop(task_id, None)
        with _broker_errors("forgetting told trials"):
            keys = [result_key(task_id) for task_id in ids]
            if self._metas_on_broker:
                keys += [self._backend.get_key_for_task(task_id) for task_id in ids]
            reserved = _still_reserved(self._broker, set(ids))
            pipe = self._broker.pipeline(transaction=False)
            pipe.delete(*keys)
            for task_id in reserved:
                pipe.set(withdrawn_key(task_id), 1, ex=self._key_ttl_s)
            pipe.execute()
            if not self._metas_on_broker:
                for task_id in ids:
                    self._backend.forget(task_id)

    def reports(self) -> DriverReports:
        """Trials report on the broker's Redis (`trialq.wire.channel`)."""
        return DriverReports(ReportChannel(self._broker, self._key_ttl_s, self._seal))

    def questions(self) -> QuestionChannel:
        """Trials ask their driver on the broker's Redis (`trialq.wire.suggest`)."""
        return ReportChannel(self._broker, self._key_ttl_s, self._seal).questions()

    def live_worker_count(self, queue: str) -> int:
        """Workers whose heartbeat is fresh and who consume the queue."""
        with _broker_errors("reading heartbeats"):
            beats = heartbeat.live_workers(self._broker)
        return sum(queue in beat.queues for beat in beats)

    def wait_for_results(self, timeout_s: float) -> bool:
        """Wait for a trial of a study sent through here to announce its stored result, or
        `timeout_s` (`ResultAnnouncements.wait`)."""
        return self._announcements.wait(timeout_s)

    def results_announced(self) -> set[str] | None:
        """The task ids announced since the last call (`ResultAnnouncements.taken`)."""
        return self._announcements.taken()


def _sealed(request: TrialRequest, seal: Seal | None) -> TrialRequest:
    """The request saying whether this driver signs its answers to the trial's questions,
    and its trial function, where carried as code, signed with the cluster's secret
    (`trialq.wire.carried_code`); unsigned without one, and refused by every worker."""
    update: dict[str, object] = {"answers_signed": seal is not None}
    if request.code is not None and seal is not None:
        update["code_signature"] = carried_code.signature(seal, request.code)
    return request.model_copy(update=update)


def _with_log_file(status: TaskStatus, beacon: bytes | None) -> TaskStatus:
    """The status with the log file its attempt's beacon names, if it names one."""
    log_file = _log_file_named(beacon)
    return status if log_file is None else replace(status, log_file=log_file)


@functools.lru_cache(maxsize=4096)
def _log_file_named(beacon: bytes | None) -> str | None:
    """What a beacon's value names, parsed once: every pass reads every attempt's beacon, and
    an attempt's value never changes while it runs."""
    found = heartbeat.AttemptBeacon.read(beacon)
    return None if found is None else found.log_file


class TrustedResults:
    """The results the driver takes: with a seal, only those signed for their task with the
    deployment's secret (`trialq.wire.signing`); always, only those that are a result. One
    set aside is said once, in one line naming the task and why."""

    def __init__(self, seal: Seal | None) -> None:
        self._seal = seal
        self.refusals: dict[str, str] = {}
        """Why each task's result was set aside (the first said: one line a task)."""

    def trusted(self, task_id: str, stored: Any) -> TrialResult | None:
        """The result stored for `task_id` (JSON text, or what Celery decoded), or None
        where it is set aside."""
        refusal = stored_result_refusal(self._seal, task_id, stored)
        if refusal is None:
            try:
                body = json.loads(stored) if isinstance(stored, bytes | str) else stored
                return TrialResult.model_validate(body)
            except ValidationError as exc:
                refusal = f"not a trial result: {exc.errors()[0]['msg']}"
        self._set_aside(task_id, refusal)
        return None

    def _set_aside(self, task_id: str, refusal: str) -> None:
        if task_id not in self.refusals:
            self.refusals[task_id] = refusal
            _log.warning("the result of task %s is set aside, not told: %s", task_id, refusal)


class ResultAnnouncements:
    """The driver's subscription to its studies' results channels (`keys.results_channel`):
    its pause between passes ends when a trial's result is stored, not at a fixed tick, and
    the pass that follows reads only the trials announced (`taken`)."""

    def __init__(self, broker: redis.Redis) -> None:
        self._broker = broker
        self._studies: set[str] = set()
        """The studies trials were sent for: their channels are listened to."""
        self._results: redis.client.PubSub | None = None
        self._announced: set[str] | None = None
        """Task ids announced and not yet taken; None where some may have gone unheard (no
        subscription yet, or it was down for a while): nobody can say then which are new."""

    def wait(self, timeout_s: float) -> bool:
        """Wait for an announcement, or `timeout_s`. Without a subscription (nothing sent yet,
        or Redis away) this is a plain sleep: the driver's next pass asks Redis itself."""
        deadline = time.monotonic() + timeout_s
        try:
            if self._subscribed() and self._next_result(deadline):
                self._drain_results()
                return True
        except redis.RedisError:
            self._drop_subscription()  # the pass that follows meets the outage, if it lasts
        time.sleep(max(0.0, deadline - time.monotonic()))
        return False

    def taken(self) -> set[str] | None:
        """The task ids announced since the last call, each given once; None where results
        may have been announced unheard (before the subscription, or while it was down):
        the caller then reads every trial it has in flight."""
        announced = self._announced
        self._announced = set() if self._results is not None else None
        return announced

    def listen(self, study: str) -> None:
        """Subscribe to the study's results channel, once (best effort: without it the
        driver's pause is a sleep)."""
        if study in self._studies:
            return
        self._studies.add(study)
        if self._results is not None:
            try:
                self._results.subscribe(results_channel(study))
            except redis.RedisError:
                self._announced = None  # this study's announcements may go unheard
            return
        with contextlib.suppress(redis.RedisError):
            self._subscribed()

    def _subscribed(self) -> bool:
        """Whether the results subscription is up (made, or made again after an outage)."""
        if self._results is None and self._studies:
            quiet = {"ignore_subscribe_messages": True}
            results = self._broker.pubsub(**quiet)  # type: ignore[no-untyped-call]
            results.subscribe(*(results_channel(study) for study in self._studies))
            self._results = results
        return self._results is not None

    def _next_result(self, deadline: float) -> bool:
        """Whether a result was announced before `deadline` (subscribe confirmations are
        skipped)."""
        assert self._results is not None
        while (left := deadline - time.monotonic()) > 0:
            if self._heard(self._results.get_message(timeout=left)):
                return True
        return False

    def _drain_results(self) -> None:
        """Take every announcement already here: one pass collects all of them."""
        assert self._results is not None
        while self._heard(self._results.get_message(timeout=0)):
            pass

    def _heard(self, message: dict[str, Any] | None) -> bool:
        """Note an announcement's task id; False where there was none."""
        if message is None:
            return False
        data = message.get("data")
        if self._announced is not None and isinstance(data, bytes | str):
            self._announced.add(data.decode() if isinstance(data, bytes) else data)
        return True

    def _drop_subscription(self) -> None:
        if self._results is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                self._results.close()
        self._results = None
        self._announced = None  # what is announced until it is back goes unheard


class DriverReports:
    """The driver's end of the report channel, its errors trialq's (`_broker_errors`)."""

    def __init__(self, channel: ReportChannel) -> None:
        self._channel = channel

    def read_new(self, positions: dict[TrialAddress, str]) -> dict[TrialAddress, list[Report]]:
        """Reports after each address's last seen id ('0' for none)."""
        with _broker_errors("reading reports"):
            return self._channel.read_new(positions)

    def request_prune(self, address: TrialAddress) -> None:
        """Ask the attempt at `address` to stop (`trial.should_prune()` turns true)."""
        with _broker_errors("raising a prune flag"):
            self._channel.request_prune(address)

    def memory_exceeded(self, address: TrialAddress) -> int | None:
        """The RSS at which a lost attempt killed itself for its memory limit, if it did."""
        with _broker_errors("reading a memory kill"):
            return self._channel.memory_exceeded(address)

    def stop_requested(self, address: TrialAddress) -> bool:
        """Whether the attempt was told to stop (no, while Redis is away)."""
        return self._channel.stop_requested(address)

    def orphan_checkpoint(self, key: str) -> None:
        """Ask a later trial process to remove a finished trial's checkpoint folder."""
        with _broker_errors("leaving a checkpoint to remove"):
            self._channel.orphan_checkpoint(key)

    def forget(self, *addresses: TrialAddress) -> None:
        """Drop what attempts reported, once their trials are told (all in one call)."""
        with _broker_errors("dropping reports"):
            self._channel.forget(*addresses)


@contextlib.contextmanager
def _broker_errors(doing: str) -> Iterator[None]:
    """Redis's errors as trialq's: a broker away for now (lost, timing out, or refusing
    writes: full under `noeviction`, read-only; `wire/broker_away.py`) is `BrokerUnreachable`
    (the driver rides it out, and the line it logs is the cause's), any other `BrokerError`."""
    try:
        yield
    except redis.RedisError as exc:
        if broker_away(exc):
            raise BrokerUnreachable(f"broker unreachable: {_without_password(exc)}") from exc
        raise BrokerError(f"the broker failed {doing}: {_without_password(exc)}") from exc


def _reads_results_itself(producer: Any, task_id: str) -> None:
    """In place of the result backend's `on_task_call`: no subscription to the task's meta."""


def _status(meta: dict[str, Any] | None) -> TaskStatus:
    """Map Celery's result meta onto a `TaskStatus`."""
    state = (meta or {}).get("status", "PENDING")
    if meta is None or state in {"PENDING", "RECEIVED", "RETRY"}:
        return TaskStatus(TaskPhase.WAITING)
    if state == "STARTED":
        worker = (meta.get("result") or {}).get("hostname")
        return TaskStatus(TaskPhase.RUNNING, worker=worker)
    exc = meta.get("result")
    name = type(exc).__name__
    failure = _FAILURE_OUTCOMES.get(name, Outcome.ERROR)
    detail = f"{name}: {exc}"
    if failure is Outcome.CRASHED:
        detail = f"the trial's process ended without a result ({exc})"
    return TaskStatus(
        TaskPhase.FAILED, failure=failure, detail=detail, withdrawn=name == _WITHDRAWN
    )


ACK_WAIT_S = 2.0
"""How long forgetting waits for a told attempt's message to be acknowledged: its worker
acks just after the trial's result is stored (`acks_late`), often after the driver told it."""


def _still_reserved(broker: redis.Redis, ids: set[str]) -> set[str]:
    """Which of `ids` kombu still holds reserved once their workers had `ACK_WAIT_S` to
    acknowledge them (polled; the wait only while some are): a live worker acks within
    moments, a lost one never."""
    deadline = time.monotonic() + ACK_WAIT_S
    reserved = _reserved_ids(broker).intersection(ids)
    while reserved and time.monotonic() < deadline:
        time.sleep(0.05)
        reserved = _reserved_ids(broker).intersection(reserved)
    return reserved


def _reserved_ids(broker: redis.Redis) -> set[str]:
    """Ids of the messages kombu holds reserved and unacknowledged (`unacked`: a few per
    worker, whatever the number of trials)."""
    entries: Any = broker.hvals(KOMBU_UNACKED)
    ids = {_message_id(_reserved_message(raw)) for raw in entries}
    ids.discard(None)
    return ids  # type: ignore[return-value]


def _reserved_message(raw: bytes | str) -> dict[str, Any] | None:
    """The message of an `unacked` entry (`[message, exchange, routing key]`); None for an
    entry of another shape."""
    try:
        entry = json.loads(raw)
    except ValueError:
        return None
    return entry[0] if isinstance(entry, list) and entry and isinstance(entry[0], dict) else None


def _message_id(raw: bytes | str | dict[str, Any] | None) -> str | None:
    """The task id of a queued message; None for an entry that is no message of Celery's
    (anyone with the broker's password can push one: workers set it aside)."""
    if raw is None:
        return None
    try:
        message = json.loads(raw) if isinstance(raw, bytes | str) else raw
        task_id = (message.get("headers") or {}).get("id")
    except (ValueError, AttributeError):
        return None
    return str(task_id) if task_id else None


def _without_password(exc: BaseException) -> str:
    """An error text safe to print: Redis errors may echo the URL they failed on."""
    text = str(exc)
    return text.split("@")[-1] if "@" in text else text
