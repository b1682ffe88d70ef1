"""Whether the broker may evict trialq's keys: any `maxmemory-policy` but `noeviction`.

Under `allkeys-lru` and the like, Redis at its memory limit drops keys to make room: worker
heartbeats (their trials taken for lost and run again), results, queued messages. trialq
needs `noeviction` (docs/design.md; compose and k8s ship it); a Redis set otherwise is said
in one line by the driver and each worker at their start. A Redis that
will not say (CONFIG refused, as managed services do) is taken at its word: nothing said.
"""

from __future__ import annotations

import redis


def eviction_warning(client: redis.Redis) -> str | None:
    """One line naming the broker's evicting policy, or None where it evicts nothing (or
    will not say)."""
    try:
        answer = client.config_get("maxmemory-policy")
    except redis.RedisError:
        return None
    policy = answer.get("maxmemory-policy") if isinstance(answer, dict) else None
    if isinstance(policy, bytes):
        policy = policy.decode()
    if not policy or policy == "noeviction":
        return None
    return (
        f"warning: the broker's maxmemory-policy is {policy!r}: at its memory limit Redis "
        "drops trialq's keys (heartbeats, results, queued trials); set it to 'noeviction'"
    )
