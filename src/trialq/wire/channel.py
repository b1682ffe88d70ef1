"""The reporting channel: intermediate values up to the driver, the prune flag back down.

One Redis stream per trial attempt (bounded, read incrementally by the driver) and one flag
key the driver sets when Optuna's pruner says stop. The attempt is part of every key, so the
reports of a retried attempt never mix with the earlier one's.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from trialq.limits import INT32_MAX
from trialq.wire.keys import (
    DEFAULT_KEY_TTL_S,
    MEMORY_EXCEEDED,
    ORPHANED_CHECKPOINTS,
    PRUNE,
    REPORTS,
    STOP,
    trial_key,
)
from trialq.wire.messages import TrialRequest
from trialq.wire.signing import REPORT_SIGNATURE_FIELD, Seal

if TYPE_CHECKING:
    from trialq.wire.suggest import QuestionChannel

_log = logging.getLogger("trialq.reports")

MAX_REPORTS_KEPT = 10_000
"""A trial that reports every step of a long run keeps only this many values in Redis."""


@dataclass(frozen=True)
class TrialAddress:
    """Which attempt of which trial of which study."""

    study: str
    number: int
    attempt: int
    study_key: str | None = None
    """The study's identity on the broker (`TrialRequest.study_key`), which its keys are
    named by: two studies of one name in two storages never read each other's reports. None:
    the name stands for it (a request of an older driver, `trialq run-trial`)."""

    @classmethod
    def of(cls, request: TrialRequest) -> TrialAddress:
        """The address of the attempt `request` runs."""
        return cls(request.study, request.number, request.attempt, request.study_key)

    def key(self, part: str) -> str:
        """A Redis key that belongs to this attempt (`trialq.wire.keys.trial_key`)."""
        return trial_key(self.study_key or self.study, self.number, self.attempt, part)

    @property
    def parts(self) -> tuple[str, int, int]:
        """(study, number, attempt): what a report's signature binds it to."""
        return (self.study, self.number, self.attempt)


@dataclass(frozen=True)
class Flags:
    """What the driver, or a stopping worker, asked of an attempt."""

    prune: bool = False
    stop: bool = False


@dataclass(frozen=True)
class NumberedReport:
    """One intermediate value as the trial sends it: `seq` (1, 2, ... per attempt) is its
    stream id, so a value sent again after a lost reply is not stored twice."""

    seq: int
    step: int
    value: float


def report_refusal(step: object, value: object) -> str | None:
    """Why an intermediate value cannot be kept, or None: its step must be an integer the
    storage holds (Optuna's `trial_intermediate_values.step` is PostgreSQL's 32-bit
    `integer`; a step past it ended the driver on every run), and its value
    a finite number (Optuna keeps no NaN or infinity as one, row 8)."""
    if isinstance(step, bool) or not isinstance(step, int):
        return f"step {step!r} is not an integer"
    if not 0 <= step <= INT32_MAX:
        return f"step {step} is outside what the storage holds (0 to {INT32_MAX})"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"value {value!r} is not a number"
    if not math.isfinite(value):
        return f"value {value} is not finite"
    return None


@dataclass(frozen=True)
class Report:
    """One intermediate value, with the id the stream gave it."""

    stream_id: str
    step: int
    value: float


class ReportChannel:
    """Both ends of the channel; the trial writes reports, the driver reads them."""

    def __init__(
        self, client: redis.Redis, key_ttl_s: int = DEFAULT_KEY_TTL_S, seal: Seal | None = None
    ) -> None:
        self._client = client
        self._key_ttl_s = key_ttl_s
        """Channel keys vanish this long after their last write, even if nobody cleans them:
        `TRIALQ_KEY_TTL_S`, handed in by whoever holds the settings."""
        self._seal = seal
        """With the deployment's result secret: the trial signs each report, and the driver
        refuses one that does not verify (`trialq.wire.signing`)."""

    def report(self, address: TrialAddress, step: int, value: float) -> None:
        """Append one intermediate value (called by the trial, maybe every epoch).

        Best effort: while Redis is away a value is dropped rather than failing the trial.
        """
        key = address.key(REPORTS)
        pipe = self._client.pipeline(transaction=False)
        pipe.xadd(key, self._fields(address, step, value), maxlen=MAX_REPORTS_KEPT)  # type: ignore[arg-type]
        pipe.expire(key, self._key_ttl_s)
        with contextlib.suppress(redis.RedisError):
            pipe.execute()

    def with_timeout(self, seconds: float) -> ReportChannel:
        """The same channel over a client of its own whose every connect and reply is
        awaited `seconds` at most, and never retried: for a caller that retries itself."""
        client = _client_with_timeout(self._client, seconds)
        return ReportChannel(client, self._key_ttl_s, self._seal)

    def questions(self, answers_signed: bool = True) -> QuestionChannel:
        """The channel on which the same attempts ask their driver (`trialq.wire.suggest`);
        `answers_signed`: whether the driver signs its answers."""
        from trialq.wire.suggest import QuestionChannel  # it builds on this module

        return QuestionChannel(self._client, self._seal, self._key_ttl_s, answers_signed)

    def send_reports(self, address: TrialAddress, reports: Sequence[NumberedReport]) -> None:
        """Append numbered values in one round trip; raises `redis.RedisError` if Redis did
        not take them. Idempotent: a value already in the stream (its reply was lost, and it
        is sent again) is refused by Redis as an id not above the stream's last, and ignored.
        """
        key = address.key(REPORTS)
        pipe = self._client.pipeline(transaction=False)
        for report in reports:
            fields = self._fields(address, report.step, report.value)
            pipe.xadd(key, fields, id=f"0-{report.seq}", maxlen=MAX_REPORTS_KEPT)  # type: ignore[arg-type]
        pipe.expire(key, self._key_ttl_s)
        for answer in pipe.execute(raise_on_error=False):
            if isinstance(answer, redis.ResponseError) and not _already_there(answer):
                raise answer

    def _fields(self, address: TrialAddress, step: int, value: float) -> dict[str, str | int]:
        """A report's stream entry: its step, its value as text, and its signature."""
        fields: dict[str, str | int] = {"step": step, "value": repr(value)}
        if self._seal is not None:
            signature = self._seal.report_signature(address.parts, step, repr(value))
            fields[REPORT_SIGNATURE_FIELD] = signature
        return fields

    def flags(self, address: TrialAddress) -> Flags:
        """Both flags an attempt reads, in one round trip; raises `redis.RedisError`."""
        pipe = self._client.pipeline(transaction=False)
        pipe.exists(address.key(PRUNE))
        pipe.exists(address.key(STOP))
        prune, stop = pipe.execute()
        return Flags(prune=bool(prune), stop=bool(stop))

    def prune_requested(self, address: TrialAddress) -> bool:
        """Whether the driver has asked this attempt to stop (no, while Redis is away)."""
        try:
            return bool(self._client.exists(address.key(PRUNE)))
        except redis.RedisError:
            return False

    def mark_memory_exceeded(self, address: TrialAddress, rss_bytes: int) -> None:
        """Leave word, before the process kills itself, that it died of its memory limit."""
        self._client.set(address.key(MEMORY_EXCEEDED), rss_bytes, ex=self._key_ttl_s)

    def memory_exceeded(self, address: TrialAddress) -> int | None:
        """The RSS at which a lost attempt killed itself for its memory limit, if it did."""
        raw = self._client.get(address.key(MEMORY_EXCEEDED))
        return None if raw is None else int(raw)

    def request_stop(self, address: TrialAddress) -> None:
        """Raise the flag that `trial.should_stop()` reads: save and return (called by the
        worker that got SIGTERM, or by anyone who wants the attempt to end early)."""
        self._client.set(address.key(STOP), 1, ex=self._key_ttl_s)

    def stop_requested(self, address: TrialAddress) -> bool:
        """Whether this attempt was told to stop (no, while Redis is away)."""
        try:
            return bool(self._client.exists(address.key(STOP)))
        except redis.RedisError:
            return False

    def orphan_checkpoint(self, key: str) -> None:
        """Ask a later trial process to remove a finished trial's checkpoint folder."""
        self._client.rpush(ORPHANED_CHECKPOINTS, key)

    def take_orphaned_checkpoints(self, count: int) -> list[str]:
        """Take up to `count` keys off the orphans list (each goes to one taker only)."""
        try:
            taken: Any = self._client.lpop(ORPHANED_CHECKPOINTS, count)
        except redis.RedisError:
            return []
        return [_text(key) for key in taken or []]

    def request_prune(self, address: TrialAddress) -> None:
        """Raise the flag that `trial.should_prune()` reads (called by the driver)."""
        self._client.set(address.key(PRUNE), 1, ex=self._key_ttl_s)

    def read_new(self, positions: dict[TrialAddress, str]) -> dict[TrialAddress, list[Report]]:
        """Reports after each address's last seen stream id ('0' for none), in one call."""
        if not positions:
            return {}
        by_key = {address.key(REPORTS): address for address in positions}
        streams = {address.key(REPORTS): last for address, last in positions.items()}
        found: dict[TrialAddress, list[Report]] = {}
        answer: Any = self._client.xread(streams)  # type: ignore[arg-type]
        for key, entries in answer or []:
            address = by_key[_text(key)]
            found[address] = _kept(address, entries, self._seal)
        return found

    def forget(self, *addresses: TrialAddress) -> None:
        """Delete attempts' keys once their trials are told: one DEL for all of them."""
        parts = (REPORTS, PRUNE, MEMORY_EXCEEDED, STOP)
        keys = [address.key(part) for address in addresses for part in parts]
        if keys:
            self._client.delete(*keys)


def _already_there(error: redis.ResponseError) -> bool:
    """Redis's refusal of an XADD whose id is not above the stream's last one."""
    return "equal or smaller than the target stream top item" in str(error)


def _client_with_timeout(client: redis.Redis, seconds: float) -> redis.Redis:
    """A client to the same server, database and credentials with short socket timeouts
    and no retries of its own. redis-py keeps the settings a pool was made with in
    `connection_kwargs`; the `orig_*` copies and the pool's own handler are its state."""
    pool = client.connection_pool
    kwargs = {
        name: value
        for name, value in pool.connection_kwargs.items()
        if not name.startswith("orig_") and name != "maint_notifications_pool_handler"
    }
    kwargs |= {"socket_timeout": seconds, "socket_connect_timeout": seconds}
    kwargs["retry"] = Retry(NoBackoff(), 0)
    return redis.Redis(connection_pool=redis.ConnectionPool(pool.connection_class, **kwargs))


def _kept(address: TrialAddress, entries: list[Any], seal: Seal | None) -> list[Report]:
    """The stream's entries as reports, less those the storage cannot hold (an old worker's,
    anyone's who writes to Redis) and, with a seal, those that do not verify: each refused in
    the driver's log, never written."""
    reports: list[Report] = []
    for entry_id, fields in entries:
        report, refusal = _to_report(entry_id, fields)
        if report is not None and seal is not None:
            refusal = _unverified(seal, address, fields)
            report = None if refusal is not None else report
        if report is not None:
            reports.append(report)
        else:
            _log.warning(
                "study %s trial #%d attempt %d: a report refused: %s",
                address.study, address.number, address.attempt, refusal,
            )  # fmt: skip
    return reports


def _unverified(
    seal: Seal, address: TrialAddress, fields: dict[bytes | str, bytes | str]
) -> str | None:
    """Why a well-formed report's signature does not verify, or None."""
    decoded = {_text(k): _text(v) for k, v in fields.items()}
    step, value = int(decoded["step"]), decoded["value"]
    return seal.report_refusal(address.parts, step, value, decoded.get(REPORT_SIGNATURE_FIELD))


def _to_report(
    entry_id: bytes | str, fields: dict[bytes | str, bytes | str]
) -> tuple[Report | None, str | None]:
    """The entry as a report, or why it is none."""
    decoded = {_text(k): _text(v) for k, v in fields.items()}
    step, value = _parsed(decoded.get("step"), int), _parsed(decoded.get("value"), float)
    refusal = report_refusal(step, value)
    if refusal is None and isinstance(step, int) and isinstance(value, float):
        return Report(_text(entry_id), step, value), None
    return None, refusal or "malformed"


def _parsed(text: str | None, kind: type[int] | type[float]) -> object:
    """`text` as a `kind`, or as it was where it is none."""
    try:
        return kind(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return text


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
