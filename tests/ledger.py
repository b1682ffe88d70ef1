"""The tables printed after the fault and compose suites, and kept as JSON beside the
benchmarks' results.

A test records its rows with `record`; the root conftest attaches them to the test's report
(`attach`), so that they reach the process that prints the summary (`collect`) even when the
test ran in a pytest-xdist worker.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

RESULTS = Path(__file__).parents[1] / "benchmarks" / "results"
PROPERTY = "trialq_ledger"

_recorded: list[tuple[str, dict[str, Any]]] = []
"""Rows recorded in this process and not yet attached to a report."""
_collected: dict[str, list[dict[str, Any]]] = {}
"""Rows from every report this process saw, by table."""


def record(table: str, row: dict[str, Any]) -> None:
    """Add a row to `table` ("faults", "compose" or "compose_cold_start")."""
    _recorded.append((table, row))


def attach(item: pytest.Item) -> None:
    """Move the rows recorded so far onto the test's report."""
    while _recorded:
        item.user_properties.append((PROPERTY, _recorded.pop(0)))


def collect(report: pytest.TestReport) -> None:
    for name, value in report.user_properties:
        if name == PROPERTY:
            table, row = value
            _collected.setdefault(table, []).append(row)


def summarize(write: Callable[[str], None]) -> None:
    """Print the tables that have rows and write their JSON files."""
    faults = _collected.get("faults", [])
    if faults:
        write("")
        write(
            "fault                                   | n_trials | finished | lost | told twice "
            "| left RUNNING | outcomes"
        )
        write(
            "----------------------------------------|----------|----------|------|------------"
            "|--------------|---------"
        )
        for v in faults:
            outcomes = ", ".join(f"{k} {n}" for k, n in sorted(v["outcomes"].items()))
            write(_row(v, 40) + f" | {outcomes}")
        _write_json("faults.json", faults)
    compose = _collected.get("compose", [])
    cold_starts = [row["seconds"] for row in _collected.get("compose_cold_start", [])]
    if compose or cold_starts:
        for seconds in cold_starts:
            write(f"compose up -> all healthy: {seconds:.1f} s")
        for v in compose:
            write(_row(v, 44))
        _write_json("compose.json", {"cold_start_s": cold_starts, "faults": compose})


def _row(v: dict[str, Any], width: int) -> str:
    return (
        f"{v['fault']:<{width}}| {v['n_trials']:>8} | {v['finished']:>8} | {v['lost']:>4} | "
        f"{v['told_twice']:>10} | {v['left_running']:>12}"
    )


def _write_json(name: str, content: object) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / name).write_text(json.dumps(content, indent=2))
