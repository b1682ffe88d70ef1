"""The trials running on each queue's workers, counted where an autoscaler can read them.

Why trialq keeps this count itself: kombu's Redis transport moves a message it delivers into
one hash, `unacked` (with its index, `unacked_index`), until the worker acknowledges it, and
that hash holds the reserved messages of every queue of the Redis DB; its size says how many
trials run, not on which queue. KEDA's redis scaler (`type: redis`, 2.0 and later) reads one
key's size by its type (LLEN for a list, SCARD for a set, HLEN for a hash, ZCARD for a sorted
set), so a class of workers scaled on `unacked` is kept up by every other class's trials.

So each trial process claims its task in a sorted set per spec queue
(`queue_running_key`, `trialq:queue-running:<queue>`): a claim is the task id, scored by
the time it lapses, renewed with the trial's beacon (every heartbeat interval, one heartbeat
TTL ahead) and removed when the trial ends. The queue is the spec's (`gpu`) for a trial
delivered on one of its class queues (`gpu@1x16g`): the workers of one Deployment consume
their queue and its classes, and the count is theirs. A trial process killed outright leaves
its claim behind until it lapses: each renewal on the queue first removes lapsed claims, and
the set's own TTL (the last writer's) removes it where no trial of the queue runs any more.
KEDA counts the set's size, so a lapsed claim counts until the next renewal on its queue or
the set's expiry, at most a heartbeat TTL: the scaler's stabilisation window is far longer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import redis

from trialq.wire.keys import queue_running_key
from trialq.wire.routing import base_queue


@dataclass(frozen=True)
class QueueClaim:
    """One trial process's claim on its queue's running count."""

    queue: str
    """The spec's queue (a class queue's base)."""
    task_id: str

    @classmethod
    def for_delivery(cls, routing_key: str, task_id: str) -> QueueClaim:
        """The claim of a task delivered with `routing_key` (its queue, or a class of it)."""
        return cls(base_queue(routing_key), task_id)

    @property
    def key(self) -> str:
        """The sorted set the claim is kept in."""
        return queue_running_key(self.queue)

    def renew(self, pipe: Any, ttl_ms: int, now_s: float | None = None) -> None:
        """Queue, on a Redis pipeline, the claim renewed for `ttl_ms` and lapsed claims
        removed; the set expires with the claim (no trial of the queue renews it then)."""
        now_ms = int((time.time() if now_s is None else now_s) * 1000)
        pipe.zremrangebyscore(self.key, "-inf", now_ms)
        pipe.zadd(self.key, {self.task_id: now_ms + ttl_ms})
        pipe.pexpire(self.key, ttl_ms)

    def release(self, client: redis.Redis) -> None:
        """The trial ended: it no longer counts."""
        client.zrem(self.key, self.task_id)


def running_on(client: redis.Redis, queue: str, now_s: float | None = None) -> int:
    """How many trials run on the workers of spec queue `queue`, lapsed claims left out (what
    KEDA reads counts those too, until the next renewal removes them)."""
    now_ms = int((time.time() if now_s is None else now_s) * 1000)
    return int(client.zcount(queue_running_key(queue), now_ms, "+inf"))
