"""What each outcome means, said once on the enum; the result's constructors; the stored record.

The table below is the whole of docs/design.md's "What every finished trial records" and
"Added with the third round" on outcomes: a member added to `Outcome` without a row here (or
without a case in `Outcome.meaning`, which mypy checks is exhaustive) fails this test.
"""

from __future__ import annotations

import math
import os
import socket

import pytest

from trialq.wire.entrypoint import EntrypointRef
from trialq.wire.messages import Measurements, TrialRequest, TrialResult
from trialq.wire.outcome import Learnt, Meaning, Outcome, Resent, Told
from trialq.wire.record import TrialRecord, recorded_of

MEANINGS = {
    Outcome.OK: Meaning(Told.COMPLETE, Resent.NEVER, Learnt.VALUES, in_failure_streak=False),
    Outcome.PRUNED: Meaning(Told.PRUNED, Resent.NEVER, Learnt.PRUNED, in_failure_streak=False),
    Outcome.OOM: Meaning(Told.FAIL, Resent.NEVER, Learnt.CONSTRAINT, in_failure_streak=False),
    Outcome.TIMEOUT: Meaning(Told.FAIL, Resent.NEVER, Learnt.FAILED, in_failure_streak=False),
    Outcome.NOT_FINITE: Meaning(Told.FAIL, Resent.NEVER, Learnt.FAILED, in_failure_streak=False),
    Outcome.ERROR: Meaning(Told.FAIL, Resent.NEVER, Learnt.NOTHING, in_failure_streak=True),
    # A guard kill: told with its figures, never an `oom`, never fed to the sampler.
    Outcome.GPU_GUARD: Meaning(Told.FAIL, Resent.NEVER, Learnt.NOTHING, in_failure_streak=True),
    Outcome.WORKER_LOST: Meaning(
        Told.FAIL, Resent.WITHIN_RETRIES, Learnt.NOTHING, in_failure_streak=True
    ),
    Outcome.CRASHED: Meaning(
        Told.FAIL, Resent.WITHIN_RETRIES_IF_ASKED, Learnt.NOTHING, in_failure_streak=True
    ),
    Outcome.REFUSED: Meaning(
        Told.FAIL, Resent.USING_NO_RETRY, Learnt.NOTHING, in_failure_streak=True
    ),
    Outcome.PREEMPTED: Meaning(
        Told.FAIL, Resent.WITHIN_PREEMPTIONS, Learnt.NOTHING, in_failure_streak=False
    ),
    Outcome.STOPPED: Meaning(Told.FAIL, Resent.NEVER, Learnt.NOTHING, in_failure_streak=False),
}


def test_every_outcome_says_what_it_means() -> None:
    assert set(MEANINGS) == set(Outcome), "an outcome without a row: say what it means here"


@pytest.mark.parametrize("outcome", list(Outcome))
def test_meaning_of(outcome: Outcome) -> None:
    assert outcome.meaning == MEANINGS[outcome]


def test_only_ok_and_pruned_succeed_and_only_preempted_resumes() -> None:
    assert {o for o in Outcome if o.succeeded} == {Outcome.OK, Outcome.PRUNED}
    assert {o for o in Outcome if o.resumes} == {Outcome.PREEMPTED}
    assert {o for o in Outcome if o.teaches_a_constraint} == {Outcome.OOM}


def test_an_unknown_outcome_reads_as_none() -> None:
    assert Outcome.read("oom") is Outcome.OOM
    assert Outcome.read("evaporated") is None
    assert Outcome.read(None) is None and Outcome.read(3) is None


REQUEST = TrialRequest(
    study="s", number=4, attempt=2, params={}, entrypoint=EntrypointRef.parse("m:f"), timeout_s=5
)


def test_a_result_of_a_request_carries_its_address() -> None:
    result = TrialResult.of(REQUEST, Outcome.WORKER_LOST, "gone")
    assert (result.study, result.number, result.attempt) == ("s", 4, 2)
    assert (result.outcome, result.error, result.worker_pid) == (Outcome.WORKER_LOST, "gone", None)


def test_a_result_here_names_this_process() -> None:
    timed = Measurements(duration_s=0.5)
    result = TrialResult.here(REQUEST, Outcome.OK, None, timed, metrics={"v": 1.0})
    assert (result.worker_pid, result.worker_host) == (os.getpid(), socket.gethostname())
    assert result.metrics == {"v": 1.0} and result.duration_s == 0.5
    refused = TrialResult.device_refused_here(REQUEST, "dirty")
    assert refused.device_refused and refused.outcome is Outcome.ERROR and refused.error == "dirty"


def test_amending_a_result_keeps_the_rest() -> None:
    result = TrialResult.here(REQUEST, Outcome.OK, metrics={"v": 1.0})
    failed = result.failed_as(Outcome.NOT_FINITE, "nan")
    assert (failed.outcome, failed.error, failed.metrics) == (Outcome.NOT_FINITE, "nan", {"v": 1.0})
    assert result.with_error("e").error == "e"
    assert result.measured_also(Measurements(peak_rss_bytes=7)).peak_rss_bytes == 7
    seen = Measurements(gpu_process_peak_bytes={"0": 9}, oom_caused_by_neighbour=True)
    guarded = result.measured_also(seen)
    assert guarded.metrics == {"v": 1.0} and guarded.duration_s == result.duration_s
    assert guarded.gpu_process_peak_bytes == {"0": 9} and guarded.oom_caused_by_neighbour
    assert result.with_checkpoint_removed(True).checkpoint_removed
    too_large = result.unstorable("too large")
    assert (too_large.outcome, too_large.metrics, too_large.error) == (
        Outcome.ERROR,
        {},
        "too large",
    )


def test_a_record_writes_only_what_is_set() -> None:
    record = TrialRecord(
        task_id="t", attempts=1, checkpoint_key="s/4-abcdef", retries=0, preemptions=0
    )
    assert record.attrs() == {
        "task_id": "t", "attempts": 1, "checkpoint_key": "s/4-abcdef", "retries": 0, "preemptions": 0,
    }  # fmt: skip
    assert TrialRecord(outcome=Outcome.STOPPED, error="x").attrs() == {
        "outcome": "stopped",
        "error": "x",
    }


def test_a_told_record_is_the_results_attrs_and_the_drivers() -> None:
    measured = Measurements(duration_s=7200, gpu_model="NVIDIA H100")
    result = TrialResult.here(
        REQUEST, Outcome.OK, None, measured, metrics={"v": 1.0, "bad": math.nan}
    )
    attrs = TrialRecord.told(
        result, task_id="t", attempts=2, retries=1, preemptions=0, gpus=2
    ).attrs()
    assert attrs == {
        **recorded_of(result), "task_id": "t", "attempts": 2, "retries": 1, "preemptions": 0, "gpus": 2,
    }  # fmt: skip
    assert attrs["metrics"] == {"v": 1.0, "bad": "nan"}
    assert TrialRecord.read(attrs).gpu_hours == 4.0


def test_reading_a_record_leaves_out_what_does_not_read() -> None:
    record = TrialRecord.read(
        {"outcome": "oom", "attempts": "many", "duration_s": 3, "x": 1, "gpu_model": "T4"}
    )
    assert record.known_outcome is Outcome.OOM and record.attempts is None
    assert record.duration_s == 3.0 and record.gpu_hours == 3 / 3600
    assert TrialRecord.read({"outcome": "later"}).known_outcome is None
    assert TrialRecord.outcome_in({"outcome": "oom"}) is Outcome.OOM
    assert TrialRecord.read({"gpu_peak_bytes": 5}).gpu_peak == 5
    assert TrialRecord.read({"gpu_peak_bytes": 5, "gpu_memory_used_peak_bytes": 8}).gpu_peak == 8
