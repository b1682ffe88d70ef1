"""The relay of intermediate values from the trials in flight to Optuna's pruner, and the
prune flag back; and the report keys of attempts done with, dropped in one call a pass.

Optuna takes intermediate values for one objective only: with several, nothing is relayed
and nothing is pruned.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping

from trialq.driver._storage.store import TrialStore
from trialq.driver.in_flight import InFlight
from trialq.errors import BrokerError
from trialq.wire.channel import Report, TrialAddress
from trialq.wire.dispatch import TaskPhase, TaskStatus, TrialReports


class ReportRelay:
    """Reads what attempts report, records it on their trials, and raises prune flags."""

    def __init__(
        self,
        channel: TrialReports,
        store: TrialStore,
        clock: Callable[[], float],
        reporting: bool,
    ) -> None:
        self._channel, self._store, self._clock = channel, store, clock
        self._reporting = reporting
        """Whether trials report intermediate values (Optuna takes none for several
        objectives)."""
        self._final_reports: dict[TrialAddress, list[Report]] = {}
        """Reports of attempts that ended, read at once in this pass (`read_final`)."""
        self._to_forget: list[TrialAddress] = []
        """Attempts done with in this pass, whose report keys go in one call."""

    def relay(self, in_flight: Iterable[InFlight]) -> None:
        """Hand new intermediate values to Optuna and raise the prune flag when it says so."""
        if not self._reporting:
            return
        by_address = {entry.address: entry for entry in in_flight}
        positions = {address: entry.reports_seen for address, entry in by_address.items()}
        for address, reports in self._channel.read_new(positions).items():
            self._relay(by_address[address], reports)

    def read_final(
        self, statuses: Mapping[str, TaskStatus], in_flight: Mapping[str, InFlight]
    ) -> None:
        """The last reports of every attempt that ended, in one read before any is told
        (`drain` takes them from here): read after the statuses, so nothing a trial
        reported before its result is missed. Good for this pass only (`end_pass`)."""
        if not self._reporting:
            return
        ended = [
            in_flight[task_id]
            for task_id, status in statuses.items()
            if status.phase in (TaskPhase.FINISHED, TaskPhase.FAILED)
        ]
        if ended:
            positions = {entry.address: entry.reports_seen for entry in ended}
            found = self._channel.read_new(positions)
            self._final_reports = {address: found.get(address, []) for address in positions}

    def end_pass(self) -> None:
        """Drop the final reports read in this pass."""
        self._final_reports = {}

    def drain(self, entry: InFlight) -> None:
        """Before a trial is told: the values it reported since the last relay. Its process
        wrote them before its result, so the curve Optuna keeps is whole; the pruner judges
        later trials against it. Called while the trial is still in flight, so a broker
        outage here leaves it to be collected again."""
        if not self._reporting:
            return
        reports = self._final_reports.pop(entry.address, None)
        if reports is None:  # told while it ran (its worker lost): not read with the ended
            found = self._channel.read_new({entry.address: entry.reports_seen})
            reports = found.get(entry.address, [])
        self._record(entry, reports)

    def _relay(self, entry: InFlight, reports: list[Report]) -> None:
        self._record(entry, reports)
        if entry.prune_requested_at is None and entry.trial.should_prune():
            self._channel.request_prune(entry.address)
            entry.prune_requested_at = self._clock()

    def _record(self, entry: InFlight, reports: list[Report]) -> None:
        values = {report.step: report.value for report in reports}  # the latest per step
        self._store.record_intermediates(entry.trial, values)
        if reports:
            entry.reports_seen = reports[-1].stream_id

    def forget(self, entry: InFlight) -> None:
        """Drop the attempt's report keys with the others of this pass (`forget_told`)."""
        self._to_forget.append(entry.address)

    def forget_told(self) -> None:
        """One call for every attempt done with in this pass: a round trip each was most of
        a driver's time a trial, far from its Redis. Where Redis is away, the next pass
        tries again (the keys expire anyway: `TRIALQ_KEY_TTL_S`)."""
        if not self._to_forget:
            return
        with contextlib.suppress(BrokerError):
            self._channel.forget(*self._to_forget)
            self._to_forget = []

    def orphan_checkpoint(self, key: str) -> None:
        """Ask a later trial process to remove a finished trial's checkpoint folder
        (`trialq.trial.checkpoints`); best effort: Redis away, the folder stays."""
        with contextlib.suppress(BrokerError):
            self._channel.orphan_checkpoint(key)
