"""The driver's ask/tell loop with an in-process stand-in dispatcher (no Celery, no Redis),
on SQLite, and on the machine's real PostgreSQL where the driver commits beside its loop.

The real path is covered by the integration tests; this one drives outcomes that cannot be
produced on a machine without a GPU, such as a worker refusing a trial for a dirty device.
"""

from __future__ import annotations

import contextlib
import textwrap
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from stand_in import StandInDispatcher
from waiting import wait_until

from trialq.driver.loop import DriverOptions, StudyDriver
from trialq.driver.pacing import MOST_PAUSE_S
from trialq.driver.progress import NoProgress
from trialq.driver.study import open_study
from trialq.oom_stand_ins import counted_state
from trialq.spec import load_spec
from trialq.wire.channel import Report, TrialAddress
from trialq.wire.dispatch import TaskStatus
from trialq.wire.messages import Outcome


def _driver(
    tmp_path: Path,
    script: list[dict[str, object]],
    dispatcher: StandInDispatcher | None = None,
    storage: str | None = None,
    name: str = "loop",
    n_trials: int = 1,
    study_keys: str = "",
    max_in_flight: int = 1,
    progress: NoProgress | None = None,
) -> tuple[StudyDriver, StandInDispatcher]:
    """A driver of a one-trial study (or `n_trials`, with more `study_keys`), in SQLite in
    `tmp_path` unless `storage` says where; with `dispatcher`, on the same broker."""
    path = tmp_path / "study.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            [study]
            name = "{name}"
            n_trials = {n_trials}
            {study_keys}
            [trial]
            entrypoint = "trials:quadratic"
            max_retries = 1
            [space.x]
            type = "float"
            low = 0
            high = 1
            """
        )
    )
    spec = load_spec(path)
    study = open_study(spec, storage or "sqlite:///" + str(tmp_path / "loop.db"))
    dispatcher = dispatcher or StandInDispatcher(script)
    options = DriverOptions(max_in_flight=max_in_flight, poll_interval_s=0)
    return StudyDriver(spec, study, dispatcher, progress or NoProgress(), options), dispatcher


def test_a_trial_refused_for_a_dirty_device_is_sent_again_with_the_same_params(
    tmp_path: Path,
) -> None:
    refused = {
        "outcome": Outcome.ERROR,
        "error": "device GPU-0 still holds",
        "device_refused": True,
    }
    driver, dispatcher = _driver(
        tmp_path, [refused, {"outcome": Outcome.OK, "metrics": {"value": 0.5}}]
    )

    driver.run()

    (trial,) = driver.study.trials
    assert trial.state is optuna.trial.TrialState.COMPLETE and trial.value == 0.5
    assert trial.user_attrs["attempts"] == 2
    first, second = dispatcher.sent.values()
    assert first.params == second.params and (first.attempt, second.attempt) == (1, 2)


def test_refusals_beyond_max_retries_end_the_trial_as_failed(tmp_path: Path) -> None:
    refused = {
        "outcome": Outcome.ERROR,
        "error": "device GPU-0 still holds",
        "device_refused": True,
    }
    driver, _ = _driver(tmp_path, [refused, refused])

    driver.run()

    (trial,) = driver.study.trials
    assert trial.state is optuna.trial.TrialState.FAIL
    assert trial.user_attrs["attempts"] == 2
    assert "device GPU-0 still holds" in trial.user_attrs["error"]


def test_a_trial_asked_but_never_sent_ends_as_failed_and_another_takes_its_place(
    tmp_path: Path,
) -> None:
    driver, _ = _driver(tmp_path, [{"outcome": Outcome.OK, "metrics": {"value": 0.5}}])
    driver.study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    # The driver stops here: the trial's params were never persisted, nothing was sent.

    ok = {"outcome": Outcome.OK, "metrics": {"value": 0.5}}
    resumed, dispatcher = _driver(tmp_path, [ok], n_trials=2)
    resumed.run()

    first, second = resumed.study.trials
    assert first.state is optuna.trial.TrialState.FAIL and first.params == {}
    assert "never sent" in first.user_attrs["error"]
    assert second.state is optuna.trial.TrialState.COMPLETE and second.value == 0.5
    assert [r.number for r in dispatcher.sent.values()] == [1]


def test_a_tell_the_driver_died_before_writing_is_told_by_the_next_run_once(
    tmp_path: Path,
) -> None:
    driver, dispatcher = _driver(tmp_path, [{"outcome": Outcome.OK, "metrics": {"value": 0.5}}])
    storage = "sqlite:///" + str(tmp_path / "loop.db")
    driver.sender.fill(
        n_trials=1, finished=0, max_in_flight=1
    )  # sent: the trial and its task id are in the database
    driver._collect()  # told, in the driver's memory; the step's write would come next
    driver.forgetting.forget_written()
    assert dispatcher.forgotten == [], "a result is let go only once its tell is written"
    # The driver dies here.
    (stored,) = optuna.load_study(study_name="loop", storage=storage).trials
    assert stored.state is optuna.trial.TrialState.RUNNING and "task_id" in stored.user_attrs

    resumed, _ = _driver(tmp_path, [], dispatcher)  # the same broker holds the result
    resumed.run()

    (trial,) = optuna.load_study(study_name="loop", storage=storage).trials
    assert trial.state is optuna.trial.TrialState.COMPLETE and trial.value == 0.5
    assert trial.user_attrs["task_id"] == stored.user_attrs["task_id"]
    assert len(dispatcher.sent) == 1, "re-attached and told, not sent again"
    assert resumed.counts.complete == 1
    assert dispatcher.forgotten == [trial.user_attrs["task_id"]], "its result let go, once"


# --- PostgreSQL: the driver's records are committed beside the loop ---------------------------


@pytest.fixture
def pg_study(postgres_url: str) -> Iterator[str]:
    """A fresh study name in PostgreSQL; the study is deleted afterwards."""
    name = f"loop-{uuid.uuid4().hex[:8]}"
    yield name
    with contextlib.suppress(KeyError):
        optuna.delete_study(study_name=name, storage=postgres_url)


@contextlib.contextmanager
def _commits_held(url: str, study_name: str) -> Iterator[sqlalchemy.Connection]:
    """Hold the study's row locked from another connection: a commit that creates a trial
    waits for it, as behind another driver's transaction or a slow server."""
    engine = sqlalchemy.create_engine(url)
    with engine.connect() as connection:
        connection.execute(
            sqlalchemy.text("SELECT study_id FROM studies WHERE study_name = :name FOR UPDATE"),
            {"name": study_name},
        )
        yield connection
        connection.rollback()
    engine.dispose()


def _stored(url: str, study_name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=study_name, storage=url).trials


def test_a_trial_is_sent_only_once_its_record_is_in_postgresql(
    tmp_path: Path, postgres_url: str, pg_study: str
) -> None:
    ok = {"outcome": Outcome.OK, "metrics": {"value": 0.5}}
    driver, dispatcher = _driver(tmp_path, [ok], storage=postgres_url, name=pg_study)

    with _commits_held(postgres_url, pg_study):
        driver.sender.fill(
            n_trials=1, finished=0, max_in_flight=1
        )  # asked, recorded: the commit is on its way, and waits
        driver.sender.send_recorded(deadline=time.monotonic() + 0.5)
        assert dispatcher.sent == {}, "sent before its record was written"
        assert _stored(postgres_url, pg_study) == []

    driver.sender.send_recorded(deadline=time.monotonic() + 30)
    ((task_id, request),) = dispatcher.sent.items()
    (stored,) = _stored(postgres_url, pg_study)
    assert stored.user_attrs["task_id"] == task_id and stored.params == request.params
    driver.run()
    (told,) = _stored(postgres_url, pg_study)
    assert told.state is optuna.trial.TrialState.COMPLETE and told.value == 0.5


def test_a_failed_commit_sends_nothing_and_the_next_one_writes_it_once(
    tmp_path: Path, postgres_url: str, pg_study: str
) -> None:
    driver, dispatcher = _driver(tmp_path, [], storage=postgres_url, name=pg_study)

    with _commits_held(postgres_url, pg_study) as holder:
        driver.sender.fill(n_trials=1, finished=0, max_in_flight=1)
        # The server ends the waiting commit's session, as a restart or a failover would.
        waiting = sqlalchemy.text(
            "SELECT pid FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))"
        )
        pid = wait_until(
            lambda: holder.execute(waiting).scalar(), 30, "the commit to reach the held row"
        )
        holder.execute(sqlalchemy.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        # Not sent, not fatal: the record waits for the step's next commit (an outage).
        assert driver.sender.send_recorded(deadline=time.monotonic() + 30) is False
    assert dispatcher.sent == {}
    assert _stored(postgres_url, pg_study) == []

    driver._store.flush()  # the next commit writes what failed, first
    (stored,) = _stored(postgres_url, pg_study)
    (recording,) = driver.sender.recording
    assert stored.number == 0 and stored.user_attrs["task_id"] == recording.task_id
    assert stored.params == recording.request.params


MEDIAN_FROM_THE_THIRD = (
    "pruner = 'median'\npruner_args = { n_startup_trials = 2, n_warmup_steps = 0 }"
)


def test_the_prune_relay_runs_under_the_stand_in(tmp_path: Path) -> None:
    """The report channel is the dispatcher's (`Dispatcher.reports`): intermediate values
    reach Optuna and a trial worse than the median at every step gets its prune flag."""
    good: dict[str, object] = {
        "outcome": Outcome.OK,
        "metrics": {"value": 1.0},
        "reports": [1.0, 1.0, 1.0],
    }
    bad: dict[str, object] = {**good, "metrics": {"value": 10.0}, "reports": [10.0, 10.0]}
    keys = f"direction = 'minimize'\n{MEDIAN_FROM_THE_THIRD}"
    driver, dispatcher = _driver(
        tmp_path, [good, dict(good), bad], name="relay", n_trials=3, study_keys=keys
    )

    driver.run()

    first, second, third = driver.study.trials
    assert first.intermediate_values == {0: 1.0, 1: 1.0, 2: 1.0}
    assert third.intermediate_values == {0: 10.0, 1: 10.0}
    assert [t.state.name for t in (first, second, third)] == ["COMPLETE", "COMPLETE", "PRUNED"]
    assert len(dispatcher.channel.prune_requested) == 1


def test_a_curve_whose_last_steps_come_with_its_result_is_told_whole(tmp_path: Path) -> None:
    """A trial's last reports and its result can land in one pass, after the pass's relay.
    They are on the trial before it is told: a finished curve missing its last steps made the
    median pruner compare later trials at those steps with the better trials alone, and prune
    good ones (seen in CI: 0.99 pruned behind 1.0 and 0.9)."""

    def curve(x: float) -> dict[str, object]:
        steps = [x * (step + 1) for step in range(4)]
        return {"outcome": Outcome.OK, "metrics": {"value": steps[-1]},
                "reports": steps[:2], "late_reports": steps[2:]}  # fmt: skip

    keys = f"direction = 'maximize'\n{MEDIAN_FROM_THE_THIRD}"
    script = [curve(1.0), curve(0.9), curve(0.99)]
    driver, dispatcher = _driver(tmp_path, script, name="late", n_trials=3, study_keys=keys)

    driver.run()

    trials = driver.study.trials
    assert [sorted(t.intermediate_values) for t in trials] == [[0, 1, 2, 3]] * 3
    assert trials[1].intermediate_values[3] == pytest.approx(3.6)
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3
    assert dispatcher.channel.prune_requested == set()


def test_curves_of_trials_ending_in_one_pass_are_read_at_once_and_told_whole(
    tmp_path: Path,
) -> None:
    """Several trials ending in one pass: their last reports are read in one call (a round
    trip each was most of the time of a driver far from its Redis), each curve is whole,
    and every attempt's reports are forgotten once told."""

    def curve(x: float) -> dict[str, object]:
        return {"outcome": Outcome.OK, "metrics": {"value": x},
                "reports": [x], "late_reports": [2 * x, 3 * x]}  # fmt: skip

    script = [curve(1.0), curve(2.0), curve(3.0)]
    driver, dispatcher = _driver(tmp_path, script, name="batch", n_trials=3, max_in_flight=3)
    reads: list[int] = []
    read_new = dispatcher.channel.read_new

    def counted(positions: dict[TrialAddress, str]) -> dict[TrialAddress, list[Report]]:
        reads.append(len(positions))
        return read_new(positions)

    dispatcher.channel.read_new = counted  # type: ignore[method-assign]
    driver.run()

    curves = sorted(tuple(t.intermediate_values.values()) for t in driver.study.trials)
    assert curves == [(1.0, 2.0, 3.0), (2.0, 4.0, 6.0), (3.0, 6.0, 9.0)]
    assert 1 not in reads, reads  # the three ended in one pass: one read for their last reports
    assert dispatcher.channel.values == {}, "an attempt's reports were not forgotten"


def test_the_loop_makes_its_next_pass_when_a_result_arrives_not_after_its_poll_interval(
    tmp_path: Path,
) -> None:
    """Between passes the driver waits on the dispatcher for results, not on a fixed sleep:
    with an hour between passes, a study of three trials ends as each result comes in."""
    script: list[dict[str, object]] = [{"outcome": Outcome.OK, "metrics": {"value": v}}
                                       for v in (0.1, 0.2, 0.3)]  # fmt: skip
    driver, dispatcher = _driver(tmp_path, script, n_trials=3)
    driver.options.poll_interval_s = 3600.0
    finished = threading.Event()
    runner = threading.Thread(target=lambda: (driver.run(), finished.set()), daemon=True)

    runner.start()
    runner.join(timeout=60)  # a hang guard only: the pause would last an hour

    assert finished.is_set(), "the loop slept out its poll interval instead of waking"
    assert [t.state for t in driver.study.trials] == [optuna.trial.TrialState.COMPLETE] * 3
    assert dispatcher.waits, "the loop never waited on the dispatcher"
    assert all(woken and timeout > 3000 for timeout, woken in dispatcher.waits)


@pytest.mark.parametrize("sampler", ["gp", "gp+tpe"])
def test_gp_is_told_an_oom_trial_as_a_penalty_beyond_the_worst_real_value(
    tmp_path: Path, sampler: str
) -> None:
    """GP reads complete trials only, and constraints only where every trial has one: an
    OOM trial is told COMPLETE with a value worse than every real one (PRUNED while there
    is none yet), with no constraint, and still counts as failed in trialq's views."""
    pytest.importorskip("torch")
    ok = {"outcome": Outcome.OK, "metrics": {"value": 1.0}}
    oom = {"outcome": Outcome.OOM, "error": "CUDA out of memory"}
    script = [oom, ok, dict(oom), {**ok, "metrics": {"value": 3.0}}, dict(oom)]
    keys = f"direction = 'minimize'\nsampler = '{sampler}'"
    driver, _ = _driver(tmp_path, script, name="gp-oom", n_trials=5, study_keys=keys)

    driver.run()

    trials = driver.study.trials
    assert [t.state.name for t in trials] == ["PRUNED", *["COMPLETE"] * 4]
    assert [t.value for t in trials[1:]] == [1.0, pytest.approx(1.1), 3.0, pytest.approx(3.2)]
    assert all(t.constraints == {} for t in trials)
    assert [counted_state(t).name for t in trials] == [
        "FAIL",
        "COMPLETE",
        "FAIL",
        "COMPLETE",
        "FAIL",
    ]
    assert driver.study.best_trial.number == 1


def test_a_trial_sent_again_is_said_in_the_progress_without_verbose_logs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = {
        "outcome": Outcome.ERROR,
        "error": "device GPU-0 still holds",
        "device_refused": True,
    }
    script = [refused, {"outcome": Outcome.OK, "metrics": {"value": 0.5}}]
    driver, _ = _driver(tmp_path, script, progress=NoProgress(show_failures=True))

    driver.run()

    err = capsys.readouterr().err
    assert err.count("#0 sent again: ") == 1 and "device GPU-0 still holds" in err, err


class _SlowReads(StandInDispatcher):
    """Reads of the trials in flight that take `read_s`, as a thousand of them do."""

    def __init__(self, script: list[dict[str, object]], read_s: float) -> None:
        super().__init__(script)
        self.read_s = read_s

    def statuses(self, task_ids: Iterable[str]) -> dict[str, TaskStatus]:
        time.sleep(self.read_s)
        return super().statuses(task_ids)


def test_the_pause_between_passes_stretches_to_ten_times_what_the_reads_cost(
    tmp_path: Path,
) -> None:
    """A pass that reads for 30 ms is followed by a pause of 300 ms or so, not by the next
    pass at once: reads take at most a tenth of the driver's time (driver/pacing.py); reads
    of 200 ms stretch it to its cap, a second."""
    running = {"outcome": Outcome.OK, "metrics": {"value": 0.5}, "reports": [0.9]}
    slow = _SlowReads([running], read_s=0.03)
    driver, _ = _driver(tmp_path, [], dispatcher=slow)
    driver.run()
    longest = max(timeout for timeout, _ in slow.waits)
    assert 0.25 <= longest <= MOST_PAUSE_S, slow.waits

    slower = _SlowReads([running], read_s=0.2)
    (tmp_path / "slower").mkdir()
    driver, _ = _driver(tmp_path / "slower", [], dispatcher=slower, name="slower")
    driver.run()
    longest = max(timeout for timeout, _ in slower.waits)
    assert 0.9 * MOST_PAUSE_S <= longest <= MOST_PAUSE_S, slower.waits
