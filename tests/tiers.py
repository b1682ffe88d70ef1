"""Which tests form the fast tier, `pytest -m unit`: the tests under tests/unit that reach no
service and are not marked `slow`, marked `unit` by the root conftest as they are collected.

A test reaches a service through the fixtures that hand it the machine's Redis or PostgreSQL
(tests/conftest.py), so what it asks for says whether it needs one: nothing has to remember to
mark it, and a test that starts asking for Redis leaves the tier by itself. The tier passes
with Redis and PostgreSQL stopped (README, "Two commands for a fresh machine"); CI's one run
selects every test anyway.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

UNIT_DIR = Path(__file__).parent / "unit"

SERVICE_FIXTURES = frozenset({"redis_url", "postgres_url", "start_workers"})
"""The fixtures that reach the machine's Redis or PostgreSQL (tests/services.py)."""

SERVICE_PARAMS = {"storage_url": "postgresql"}
"""A parametrized fixture whose one value reaches a service: `storage_url` on PostgreSQL."""


def needs_a_service(fixtures: Collection[str], params: Mapping[str, object]) -> bool:
    """Whether a test asking for `fixtures` (their closure) with `params` reaches Redis or
    PostgreSQL."""
    if SERVICE_FIXTURES.intersection(fixtures):
        return True
    return any(params.get(name) == value for name, value in SERVICE_PARAMS.items())


def in_fast_tier(
    path: Path, fixtures: Collection[str], params: Mapping[str, object], slow: bool
) -> bool:
    """Whether a test belongs to `pytest -m unit`: under tests/unit, no service, not slow."""
    return path.is_relative_to(UNIT_DIR) and not slow and not needs_a_service(fixtures, params)
