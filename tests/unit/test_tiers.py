"""The fast tier (`pytest -m unit`, tests/tiers.py) takes exactly the tests under tests/unit
that reach no service and are not slow."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiers import UNIT_DIR, in_fast_tier

TESTS = UNIT_DIR.parent


@pytest.mark.parametrize(
    ("path", "fixtures", "params", "slow", "fast"),
    [
        (UNIT_DIR / "test_fate.py", ["tmp_path"], {}, False, True),
        (UNIT_DIR / "test_x.py", ["tmp_path", "redis_url"], {}, False, False),
        (UNIT_DIR / "test_x.py", ["postgres_url"], {}, False, False),
        (UNIT_DIR / "test_x.py", ["start_workers", "redis_url"], {}, False, False),
        (UNIT_DIR / "test_x.py", ["storage_url"], {"storage_url": "sqlite"}, False, True),
        (UNIT_DIR / "test_x.py", ["storage_url"], {"storage_url": "postgresql"}, False, False),
        (UNIT_DIR / "test_x.py", ["tmp_path"], {}, True, False),
        (TESTS / "integration" / "test_x.py", ["tmp_path"], {}, False, False),
        (TESTS / "faults" / "test_x.py", [], {}, False, False),
    ],
)
def test_the_fast_tier_is_tests_unit_without_services_or_slow_tests(
    path: Path, fixtures: list[str], params: dict[str, object], slow: bool, fast: bool
) -> None:
    assert in_fast_tier(path, fixtures, params, slow) is fast


def test_this_test_is_in_the_fast_tier(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("unit") is not None, "the conftest hook marks it"


@pytest.mark.slow
def test_a_slow_test_is_not(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("unit") is None


def test_a_test_reaching_redis_is_not(request: pytest.FixtureRequest, redis_url: str) -> None:
    assert request.node.get_closest_marker("unit") is None
