"""Prints the container-level fault rows and the cold start after the compose tests, and
keeps them as JSON beside the fault suite's."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from .test_cluster import COLD_START_S, LEDGER

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results" / "compose.json"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not LEDGER and not COLD_START_S:
        return
    write = terminalreporter.write_line
    for seconds in COLD_START_S:
        write(f"compose up -> all healthy: {seconds:.1f} s")
    for v in LEDGER:
        write(
            f"{v.fault:<44}| {v.n_trials:>8} | {v.finished:>8} | {v.lost:>4} | "
            f"{v.told_twice:>10} | {v.left_running:>12}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"cold_start_s": COLD_START_S, "faults": [asdict(v) for v in LEDGER]}, indent=2)
    )
