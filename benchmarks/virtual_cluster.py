"""A simulated cluster behind trialq's `Dispatcher` seam, on a virtual clock.

k workers run the trials the real `StudyDriver` sends; each trial lasts a lognormal draw
times its objective's cost, so trials finish out of order as on real GPUs. Trials with a
learning curve report one value per epoch through a stand-in of the reporting channel, and
honour a prune request at their next report. Nothing runs for real: the benchmark moves the
clock from one event (a report, an end) to the next, so a study of hundreds of GPU-hours
takes as long as its sampler's asks.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from benchmarks.search_objectives import Objective, Simulated
from trialq.wire.channel import Report, ReportChannel, TrialAddress
from trialq.wire.dispatch import TaskPhase, TaskStatus
from trialq.wire.messages import Outcome, TrialRequest, TrialResult

MEDIAN_TRIAL_S = 600.0
"""A median trial: ten virtual minutes."""
DURATION_SIGMA = 0.5
"""Spread of the lognormal durations: the slowest of 16 trials takes about twice the median."""
OOM_AFTER_S = 30.0
"""An out-of-memory trial dies as it builds its model."""


class VirtualClock:
    """The driver's clock (`DriverOptions.clock`): moved only by the benchmark."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class SimRun:
    """One attempt running on a simulated worker."""

    request: TrialRequest
    sim: Simulated
    start: float
    end: float
    report_times: tuple[float, ...]
    stopped_at: float | None = None
    """Where the trial stopped early: at the report after a prune request, or killed."""
    killed: bool = False
    task_id: str = ""

    @property
    def finishes(self) -> float:
        return self.end if self.stopped_at is None else self.stopped_at

    def pruned(self) -> bool:
        return self.stopped_at is not None and not self.killed


def trial_rng(seed: int, number: int) -> np.random.Generator:
    """One generator per (study seed, trial number): the same trial of two samplers gets the
    same noise and duration draws, so samplers differ only by what they propose."""
    return np.random.default_rng([seed, number])


class VirtualCluster:
    """The dispatcher and the reporting channel of a simulated cluster."""

    def __init__(self, objective: Objective, seed: int, clock: VirtualClock) -> None:
        self.objective = objective
        self.seed = seed
        self.clock = clock
        self.runs: dict[str, SimRun] = {}
        self.by_number: dict[int, SimRun] = {}
        self._live: dict[str, SimRun] = {}  # runs not known to have ended: what `next_event` reads
        self._ends: list[tuple[float, str]] = []
        """When each run's result is stored, soonest first: what `results_announced` gives
        (a prune request adds an earlier end; the later entry is then skipped)."""
        self._announced: set[str] = set()

    # --- Dispatcher ------------------------------------------------------------------------

    def submit(self, request: TrialRequest, queue: str, task_id: str | None = None) -> str:
        assert task_id is not None
        rng = trial_rng(self.seed, request.number)
        sim = self.objective.evaluate(request.params, rng)
        now = self.clock.now
        if sim.oom:
            duration = OOM_AFTER_S
        else:
            duration = MEDIAN_TRIAL_S * sim.cost * math.exp(rng.normal(0, DURATION_SIGMA))
        steps = len(sim.curve)
        times = tuple(now + duration * (i + 1) / steps for i in range(steps))
        run = SimRun(request, sim, now, now + duration, times, task_id=task_id)
        self.runs[task_id] = run
        self._live[task_id] = run
        self.by_number[request.number] = run
        heapq.heappush(self._ends, (run.end, task_id))
        return task_id

    def statuses(self, task_ids: Iterable[str]) -> dict[str, TaskStatus]:
        return {task_id: self._status(self.runs[task_id]) for task_id in task_ids}

    def _status(self, run: SimRun) -> TaskStatus:
        if self.clock.now < run.finishes:
            return TaskStatus(TaskPhase.RUNNING, worker="sim")
        if run.killed:
            return TaskStatus(TaskPhase.FAILED, failure=Outcome.ERROR, detail="killed")
        return TaskStatus(TaskPhase.FINISHED, result=self._result(run))

    def _result(self, run: SimRun) -> TrialResult:
        request = run.request
        base = {"study": request.study, "number": request.number, "attempt": request.attempt}
        duration = run.finishes - run.start
        if run.sim.oom:
            return TrialResult(**base, outcome=Outcome.OOM, duration_s=duration, error="OOM")
        if run.pruned():
            return TrialResult(**base, outcome=Outcome.PRUNED, duration_s=duration)
        metrics = dict(zip(self.objective.metrics, run.sim.values, strict=True))
        return TrialResult(**base, outcome=Outcome.OK, metrics=metrics, duration_s=duration)

    def pending_ids(self, queue: str) -> set[str]:
        return set()

    def worker_alive(self, worker: str) -> bool:
        return True

    def attempt_alive(self, task_id: str) -> bool:
        return True

    def withdraw(self, task_ids: Iterable[str], queue: str) -> None:
        pass

    def terminate(self, task_id: str) -> None:
        run = self.runs[task_id]
        if self.clock.now < run.finishes:
            run.stopped_at, run.killed = self.clock.now, True

    def reports(self) -> VirtualChannel:
        return VirtualChannel(self)

    def questions(self) -> None:
        return None  # virtual trials ask nothing

    def live_worker_count(self, queue: str) -> int:
        return 1

    def forget_results(self, task_ids: Iterable[str]) -> None:
        """Nothing is kept that a told trial leaves behind."""

    def wait_for_results(self, timeout_s: float) -> bool:
        """No real waiting on a virtual clock: the benchmark moves it to the next event."""
        return False

    def stop_early(self, run: SimRun, at: float) -> None:
        """The run stops at `at` (its next report after a prune request) and stores its
        result then, before the end it was sent with."""
        run.stopped_at = at
        heapq.heappush(self._ends, (at, run.task_id))

    def results_announced(self) -> set[str]:
        """The runs whose results were stored by now, as the real trial processes announce
        theirs (a killed run stores none)."""
        ended = set()
        while self._ends and self._ends[0][0] <= self.clock.now:
            _, task_id = heapq.heappop(self._ends)
            run = self.runs[task_id]
            if not run.killed and task_id not in self._announced:
                self._announced.add(task_id)
                ended.add(task_id)
        return ended

    # --- the clock -------------------------------------------------------------------------

    def next_event(self, after: float) -> float | None:
        """The first report or end after `after` among unfinished runs (None: all done)."""
        upcoming = []
        for task_id, run in list(self._live.items()):
            if run.finishes <= after:  # the clock only goes on: a run that ended stays ended
                del self._live[task_id]
                continue
            upcoming.append(run.finishes)
            upcoming.extend(t for t in run.report_times if after < t < run.finishes)
        return min(upcoming, default=None)


class VirtualChannel(ReportChannel):
    """The reporting channel of the simulated cluster: reports appear as the clock passes
    them; a prune request stops the trial at its next report, as `should_prune()` would."""

    def __init__(self, cluster: VirtualCluster) -> None:
        self.cluster = cluster

    def _run(self, address: TrialAddress) -> SimRun:
        run = self.cluster.by_number[address.number]
        assert run.request.attempt == address.attempt
        return run

    def read_new(self, positions: dict[TrialAddress, str]) -> dict[TrialAddress, list[Report]]:
        now, found = self.cluster.clock.now, {}
        for address, last in positions.items():
            run = self._run(address)
            seen = int(last)
            reports = [
                Report(str(i + 1), i + 1, run.sim.curve[i])
                for i, t in enumerate(run.report_times)
                if i >= seen and t <= min(now, run.finishes)
            ]
            if reports:
                found[address] = reports
        return found

    def request_prune(self, address: TrialAddress) -> None:
        run, now = self._run(address), self.cluster.clock.now
        later = [t for t in run.report_times if t > now]
        if later and run.stopped_at is None and later[0] < run.end:
            self.cluster.stop_early(run, later[0])

    def prune_requested(self, address: TrialAddress) -> bool:
        return self._run(address).stopped_at is not None

    def memory_exceeded(self, address: TrialAddress) -> int | None:
        return None

    def stop_requested(self, address: TrialAddress) -> bool:
        return False  # the simulated cluster is never preempted

    def orphan_checkpoint(self, key: str) -> None:
        pass

    def forget(self, *addresses: TrialAddress) -> None:
        pass
