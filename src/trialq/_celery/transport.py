"""The broker transport: kombu's Redis transport, which sets a malformed message aside.

Anyone who can write to the queue's Redis list can push anything onto it. kombu decodes
what it pops as JSON and hands it on as a message of its own shape; an entry that is not
JSON, or JSON of another shape, raises out of kombu's read (`Channel._brpop_read`) into
the worker's event loop: `Unrecoverable error`, the worker exits and takes its running
trial with it. Here such an entry is logged and moved onto `trialq:poison:<queue>`
(`trialq.wire.keys.poison_key`), and the worker reads on. A message of kombu's shape that
is not a trialq task is Celery's to refuse (it logs and drops it), and a trialq task whose
request does not validate fails as that task, in its own process.
"""

from __future__ import annotations

import json
import logging
from queue import Empty
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport.virtual.base import Message as KombuMessage
from kombu.utils.scheduling import round_robin_cycle

from trialq.wire.keys import poison_key

logger = logging.getLogger("trialq.transport")

POISON_KEEP = 1000
"""How many malformed entries a queue's poison list keeps (the newest): a flood of them
must not fill the broker's memory."""


class MalformedMessage(ValueError):
    """A queue entry kombu cannot take as a message; carries what was popped."""

    def __init__(self, raw: object, reason: str) -> None:
        super().__init__(reason)
        self.raw = raw


class QueueCycle(round_robin_cycle):
    """kombu's round-robin order of queues, remembering which queue an entry came from."""

    last: str | None = None

    def rotate(self, last_used: str) -> Any:
        self.last = last_used
        return super().rotate(last_used)  # type: ignore[no-untyped-call]


class TrialMessage(KombuMessage):
    """kombu's message, refusing a payload of another shape before anything reads it."""

    def __init__(self, payload: Any, channel: Any = None, **kwargs: Any) -> None:
        problem = shape_problem(payload)
        if problem is None:
            try:
                super().__init__(payload, channel=channel, **kwargs)  # type: ignore[no-untyped-call]
                return
            except (KeyError, TypeError, AttributeError, ValueError) as exc:
                problem = f"{type(exc).__name__}: {exc}"
        raise MalformedMessage(payload, problem)


def shape_problem(payload: Any) -> str | None:
    """What is wrong with a decoded entry as a kombu message, or None."""
    if not isinstance(payload, dict):
        return f"a JSON {type(payload).__name__}, not an object"
    properties = payload.get("properties")
    if not isinstance(properties, dict) or "delivery_tag" not in properties:
        return "no properties with a delivery_tag"
    info = properties.get("delivery_info")
    if not isinstance(info, dict) or not {"exchange", "routing_key"} <= info.keys():
        return "no delivery_info with exchange and routing_key"
    if not isinstance(payload.get("headers") or {}, dict):
        return "headers are not an object"
    return None


class TrialRedisChannel(kombu_redis.Channel):
    """kombu's Redis channel; an entry it cannot decode or take is set aside, not fatal."""

    Message = TrialMessage
    queue_order_strategy = f"{__name__}:QueueCycle"

    def _brpop_read(self, **options: Any) -> bool:
        try:
            return bool(super()._brpop_read(**options))  # type: ignore[no-untyped-call]
        except MalformedMessage as exc:
            self._set_aside(json.dumps(exc.raw), str(exc))
        except (UnicodeDecodeError, ValueError) as exc:
            raw = getattr(exc, "doc", getattr(exc, "object", None))
            if raw is None:
                raise
            self._set_aside(raw, f"not JSON: {exc}")
        raise Empty()

    def _set_aside(self, entry: str | bytes, reason: str) -> None:
        """Log the entry and keep it on the queue's poison list (kombu decoded it from UTF-8,
        replacing what was not)."""
        queue = getattr(self._queue_cycle, "last", None) or "unknown"
        logger.error(
            "malformed message on queue %r set aside in %s (%s): %.200r",
            queue, poison_key(queue), reason, entry,
        )  # fmt: skip
        try:
            with self.conn_or_acquire() as client:
                pipe = client.pipeline().lpush(poison_key(queue), entry)
                pipe.ltrim(poison_key(queue), 0, POISON_KEEP - 1).execute()
        except redis.RedisError as exc:
            logger.error("the malformed message is dropped: Redis refused it (%s)", exc)


class TrialRedisTransport(kombu_redis.Transport):
    """kombu's Redis transport with `TrialRedisChannel` (`broker_transport` of trialq)."""

    Channel = TrialRedisChannel
