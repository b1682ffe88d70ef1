"""A report sink for a `TrialContext` under test: it keeps what the trial sent, and never asks
it to prune or stop (a stand-in for the report sender, which needs Redis)."""

from __future__ import annotations

from trialq.wire.channel import TrialAddress


class KeptReports:
    def __init__(self) -> None:
        self.reports: list[tuple[int, float]] = []

    def report(self, address: TrialAddress, step: int, value: float) -> None:
        self.reports.append((step, value))

    def prune_requested(self, address: TrialAddress) -> bool:
        return False

    def stop_requested(self, address: TrialAddress) -> bool:
        return False
