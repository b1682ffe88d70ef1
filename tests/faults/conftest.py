"""Prints the fault table after `pytest tests/faults` and keeps it as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from faults.harness import LEDGER

RESULTS = Path(__file__).parents[2] / "benchmarks" / "results" / "faults.json"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not LEDGER:
        return
    write = terminalreporter.write_line
    write("")
    write(
        "fault                                   | n_trials | finished | lost | told twice | left RUNNING | outcomes"
    )
    write(
        "----------------------------------------|----------|----------|------|------------|--------------|---------"
    )
    for v in LEDGER:
        outcomes = ", ".join(f"{k} {n}" for k, n in sorted(v.outcomes.items()))
        write(
            f"{v.fault:<40}| {v.n_trials:>8} | {v.finished:>8} | {v.lost:>4} | "
            f"{v.told_twice:>10} | {v.left_running:>12} | {outcomes}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps([asdict(v) for v in LEDGER], indent=2))
