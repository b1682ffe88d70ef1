"""The serial groups (tests/conftest.py: `SERIAL_GROUPS`) hold under `pytest -n N`: a test of
a group is scheduled as its group, so the compose cluster is built once, on one worker.
pytest 9.2 with pytest-xdist 3.8 dropped the group silently (pytest-dev/pytest-xdist#1386):
the three workers each built the images, 11 minutes of CI."""

from __future__ import annotations

import os

import pytest

GROUP = "serial-groups-check"


@pytest.mark.xdist_group(GROUP)
def test_a_grouped_test_is_scheduled_as_its_group(request: pytest.FixtureRequest) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        pytest.skip("not under pytest-xdist: nothing is scheduled")
    assert request.node.nodeid.endswith(f"@{GROUP}"), (
        "pytest-xdist's loadgroup did not take the group: the compose tests would run on "
        "every worker (pytest-dev/pytest-xdist#1386: pytest 9.2 with pytest-xdist 3.8)"
    )
