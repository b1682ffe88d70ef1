"""What the driver holds of each trial it sent and has not yet told, and of each trial on its
way to being sent; shared by the loop's parts (`trialq.driver.sending`, `.relay`, `.telling`,
`.watch`)."""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import optuna

from trialq.driver.fate import Resends
from trialq.wire.channel import TrialAddress
from trialq.wire.messages import TrialRequest
from trialq.wire.record import TrialRecord


@dataclass(frozen=True)
class Sighting:
    """What one pass saw of an attempt, beside what the fate rule is told."""

    worker: str | None
    """The worker running it, as its status said (None: not said)."""
    log_file: str | None
    """The attempt's log, as its beacon named it (None: not named)."""
    claimed: bool
    """Its trial process's beacon was seen while Celery still had it waiting."""
    beating: bool
    """Its trial process's beacon was seen renewed."""


@dataclass
class InFlight:
    """A trial the driver has sent and not yet told."""

    trial: optuna.Trial
    request: TrialRequest
    task_id: str
    resends: Resends = field(default_factory=Resends)
    reports_seen: str = "0"
    prune_requested_at: float | None = None
    terminated: bool = False
    unseen_checks: int = 0
    worker: str | None = None
    """The worker running it, as its status last said (for a trial stopped from outside)."""
    claimed: bool = False
    """A trial process's beacon for it was seen while Celery still had it waiting."""
    beacon_seen: bool = False
    """A trial process's beacon for it was seen, in any phase: from then on the beacon alone
    says whether the attempt lives (`watch.Watch`)."""
    sent_at: float = field(default_factory=time.time)
    running_since: float | None = None
    """When the driver first saw the attempt's trial process beat (`time.time()`): how long
    an attempt whose process wrote no result of its own ran (killed, crashed, lost)."""
    log_file: str | None = None
    """The attempt's own log, as its beacon last named it: named on a result its process
    never wrote (killed at its hard limit, crashed, lost)."""

    def saw(self, sighting: Sighting) -> None:
        """What a pass saw of the attempt (`watch.Watch.known`): its worker and log as its
        status named them, and its process's beacon, once seen, for good."""
        self.worker = sighting.worker or self.worker
        self.log_file = sighting.log_file or self.log_file
        self.claimed = self.claimed or sighting.claimed
        self.beacon_seen = self.beacon_seen or sighting.beating
        if sighting.beating:  # it runs from its process's first beat the driver saw
            self.running_since = self.running_since or time.time()

    @property
    def address(self) -> TrialAddress:
        """The channel address of the attempt in flight."""
        return TrialAddress.of(self.request)

    def ran_for_s(self) -> float:
        """How long the attempt has run, as the driver saw it: since its process's first beat,
        else since it was sent."""
        return round(time.time() - (self.running_since or self.sent_at), 3)

    @property
    def worker_host(self) -> str | None:
        """`gpu-node-3` from Celery's worker name `trialq-12@gpu-node-3`."""
        return self.worker.rsplit("@", 1)[-1] if self.worker else None


@dataclass
class Recording:
    """A trial asked and recorded, to be sent once its record is in the database."""

    trial: optuna.Trial
    request: TrialRequest
    task_id: str
    resends: Resends
    recorded: Future[None]


def recorded_resends(record: TrialRecord) -> Resends:
    """The re-send counts a previous driver recorded; a record from before `retries` was kept
    counts every attempt that was not a preemption as a retry."""
    preemptions = record.preemptions or 0
    attempts = 1 if record.attempts is None else record.attempts
    retries = record.retries if record.retries is not None else attempts - 1 - preemptions
    return Resends(retries=retries, preemptions=preemptions)
