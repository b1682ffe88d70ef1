"""The seam between the driver and the trackers: what a tracker is given, and `Tracking`,
which runs the trackers on a daemon thread of its own so a slow, absent or silent tracking
server never holds the loop, nor the end of the run past a deadline, and says in one line a
tracker the trials it missed.

A tracker records a trial under a key of the study's name and the trial's number, and looks
it up before it creates anything: a trial told again (a re-sent attempt, a driver restarted
on the same study) updates its record, never makes a second one.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from trialq.tracking.quiet import quiet_tracking_libraries
from trialq.wire.record import TrialRecord

CLOSE_WAIT_S = 30.0
"""How long the end of a run waits for the trackers' last records; what is left is said
missing (docs/tracking.md promises the command ends within 60 s of its last trial)."""


@dataclass(frozen=True)
class StudyInfo:
    """The study the trackers record: its name, objectives and where files go."""

    name: str
    directions: tuple[str, ...]
    metric_names: tuple[str, ...]
    """One name per objective: the spec's metrics, else `value` (`values_N` for several)."""
    spec_folder: Path
    """Relative paths in `[tracking]` are taken from here."""
    artifact_root: Path | None = None
    """The study's artifact folder where it is a local one (TensorBoard's default home)."""


@dataclass(frozen=True)
class ToldTrial:
    """One trial as the driver told it."""

    number: int
    state: str
    """Optuna's state: COMPLETE, PRUNED or FAIL."""
    params: Mapping[str, Any]
    values: tuple[float, ...] | None
    intermediate: Mapping[int, float]
    """The trial's reports, by step."""
    record: TrialRecord
    """What the driver recorded of it (its user attrs, typed): outcome, attempts, worker
    host, metrics, GPU peaks."""
    started: datetime | None = None
    ended: datetime | None = None

    @property
    def final_metrics(self) -> dict[str, float]:
        """The numeric metrics the trial returned, beside its objective values."""
        metrics = self.record.metrics or {}
        return {
            str(name): float(value)
            for name, value in metrics.items()
            if isinstance(value, int | float) and not isinstance(value, bool)
        }

    @property
    def summary_attrs(self) -> dict[str, str | int | float]:
        """What every tracker records of how it ran: its state, and the record's summary
        (`TrialRecord.summary`: outcome, attempts, where, GPU peaks)."""
        return {"state": self.state} | self.record.summary()

    def objective_values(self, study: StudyInfo) -> dict[str, float]:
        """Its objective values by metric name; none for a trial that has none."""
        return dict(zip(study.metric_names, self.values or (), strict=False))


class Tracker(Protocol):
    """One tracking library's records of a study."""

    name: str

    def start(self, study: StudyInfo) -> None:
        """Open (or find again) the study's record, once a run."""

    def record(self, trial: ToldTrial) -> None:
        """Record a told trial, found by the study and its number: never twice."""

    def close(self) -> None:
        """Finish the study's record for this run."""


@dataclass
class Tracking:
    """The trackers of a run, on one daemon thread: `told` returns at once; a tracker that
    fails keeps its trial, tried again with the next (catching up). At `close` the run waits
    for the last records until a deadline, never longer (a call that hangs is left to its
    daemon thread, never joined, so it cannot hold the process at exit), and says in one line
    a tracker the trials it missed, with why."""

    trackers: Sequence[Tracker]
    study: StudyInfo | None = None
    close_wait_s: float = CLOSE_WAIT_S
    warn: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr))
    missing: dict[str, list[int]] = field(default_factory=dict)
    _pending: dict[str, list[ToldTrial]] = field(default_factory=dict)
    _started: set[str] = field(default_factory=set)
    _failures: dict[str, str] = field(default_factory=dict)
    """Each tracker's last failure, in one line; gone once it answers again."""
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _work: queue.Queue[Callable[[], None]] = field(default_factory=queue.Queue)
    _thread: threading.Thread | None = None

    def start(self, study: StudyInfo) -> None:
        """Open each tracker's study record (on the tracking thread)."""
        self.study = study
        if self.trackers:
            quiet_tracking_libraries()
            self._thread = threading.Thread(target=self._serve, name="trialq-tracking", daemon=True)
            self._thread.start()
            self._work.put(self._start_all)

    @property
    def active(self) -> bool:
        """Whether any tracker records (else the driver builds no `ToldTrial`)."""
        return self._thread is not None

    def told(self, trial: ToldTrial) -> None:
        """Record `trial` in every tracker, behind the loop's back."""
        if self._thread is not None:
            with self._lock:
                for tracker in self.trackers:
                    self._pending.setdefault(tracker.name, []).append(trial)
            self._work.put(self._record_all)

    def close(self) -> dict[str, list[int]]:
        """Wait, until the deadline, for the records on their way; the trial numbers each
        tracker missed, said in one line each."""
        if self._thread is None:
            return {}
        closed = threading.Event()
        self._work.put(self._close_all)
        self._work.put(closed.set)
        closed.wait(timeout=self.close_wait_s)
        with self._lock:
            for tracker in self.trackers:
                left = [t.number for t in self._pending.get(tracker.name, [])]
                if left or not closed.is_set():
                    self.missing[tracker.name] = sorted(left)
        for name, numbers in self.missing.items():
            self.warn(_missing_line(name, numbers, self._failures.get(name)))
        return self.missing

    def _serve(self) -> None:
        while True:
            self._work.get()()

    def _start_all(self) -> None:
        for tracker in self.trackers:
            self._open(tracker)

    def _open(self, tracker: Tracker) -> bool:
        """Whether the tracker's study record is open (opened now if it was not)."""
        if tracker.name not in self._started:
            assert self.study is not None
            study = self.study
            if not self._guarded(tracker, lambda: tracker.start(study)):
                return False
            self._started.add(tracker.name)
        return True

    def _record_all(self) -> None:
        for tracker in self.trackers:
            if not self._open(tracker):
                continue
            while (trial := self._next(tracker)) is not None:
                if not self._guarded(tracker, partial(tracker.record, trial)):
                    break
                with self._lock:
                    self._pending[tracker.name].pop(0)

    def _next(self, tracker: Tracker) -> ToldTrial | None:
        with self._lock:
            pending = self._pending.get(tracker.name)
            return pending[0] if pending else None

    def _close_all(self) -> None:
        for tracker in self.trackers:
            if tracker.name in self._started:
                self._guarded(tracker, tracker.close)

    def _guarded(self, tracker: Tracker, work: Callable[[], None]) -> bool:
        """Run one tracker's work; a failure is kept (said with what it missed), never
        raised."""
        try:
            work()
        except Exception as exc:
            self._failures[tracker.name] = (str(exc).strip().splitlines() or [type(exc).__name__])[
                0
            ][:300]
            return False
        self._failures.pop(tracker.name, None)
        return True


def _missing_line(name: str, numbers: list[int], failure: str | None) -> str:
    """The one line said of a tracker that missed trials: which, and why where known."""
    shown = ", ".join(f"#{n}" for n in numbers[:10]) or "the last trials"
    more = f" and {len(numbers) - 10} more" if len(numbers) > 10 else ""
    why = f": {failure}" if failure else ": it did not answer in time"
    return f"warning: tracking: {name}: not recorded: {shown}{more} (the study is whole){why}"
