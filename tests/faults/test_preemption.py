"""Trials that survive preemption (issue #18): each attempt of a trial finds what the last
one saved in `trial.checkpoint_dir`; SIGTERM to a worker tells its trial to stop, the
attempt ends `preempted` and the trial is re-sent, counted apart from `max_retries`."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from waiting import wait_until

from faults.harness import (
    FAST_HEARTBEAT,
    DriverRun,
    assert_clean,
    fault_spec,
    grid,
    worker_parent_running_a_trial,
)
from trialq.local import LocalCluster

pytestmark = [pytest.mark.faults, pytest.mark.integration]


def _spec(entrypoint: str, space: str, n_trials: int, **trial_keys: object) -> str:
    """The fault suite's spec, with `metric = "value"`: these trials return more metrics."""
    body = fault_spec(entrypoint, space, n_trials, **trial_keys)
    return body.replace('pruner = "none"', 'pruner = "none"\n        metric = "value"')


def _starts(metrics: dict[str, float]) -> dict[int, int]:
    """{attempt: the step it started at}, from what the trials in tests/trials.py return."""
    return {int(k.split("_")[1]): int(v) for k, v in metrics.items() if k.startswith("start_")}


def test_a_killed_trial_resumes_from_its_checkpoint_dir(
    run: DriverRun, tmp_path: Path, start_workers: Callable[..., LocalCluster]
) -> None:
    root = tmp_path / "checkpoints"
    start_workers(2, extra_env={**FAST_HEARTBEAT, "TRIALQ_CHECKPOINT_ROOT": str(root)})
    # The trial SIGKILLs itself (its worker lives): a crash, re-run only when the spec asks.
    spec = _spec("resumes_from_checkpoint", grid("x", 1, 2), 2, max_retries=2, retry_crashes=True)
    run.write_spec(spec)
    code, err = run.run()
    assert code == 0, err
    assert_clean(run.judge("SIGKILL mid-trial, resumed from ckpt", 2))
    for trial in run.study().trials:
        assert trial.user_attrs["outcome"] == "ok" and trial.user_attrs["attempts"] == 3
        # Attempt 1 saved steps 0-5, attempt 2 steps 6-7: neither later one starts from zero.
        assert _starts(trial.user_attrs["metrics"]) == {1: 0, 2: 6, 3: 8}
    assert not any(root.rglob("*")), "a finished trial's checkpoint folder is removed"


def test_keep_checkpoints_leaves_the_folder(
    run: DriverRun, tmp_path: Path, start_workers: Callable[..., LocalCluster]
) -> None:
    root = tmp_path / "checkpoints"
    start_workers(1, extra_env={**FAST_HEARTBEAT, "TRIALQ_CHECKPOINT_ROOT": str(root)})
    spec = _spec(
        "resumes_from_checkpoint", grid("x", 1), 1, keep_checkpoints=True, retry_crashes=True
    )
    run.write_spec(spec.replace("keep_checkpoints = True", "keep_checkpoints = true"))
    code, err = run.run()
    assert code == 0, err
    (trial,) = run.study().trials
    folder = root / trial.user_attrs["checkpoint_key"]
    assert (folder / "step").read_text() == "10"


def test_sigterm_to_a_worker_preempts_its_trial_which_resumes_elsewhere(
    run: DriverRun, tmp_path: Path, start_workers: Callable[..., LocalCluster]
) -> None:
    env = {
        **FAST_HEARTBEAT,
        "TRIALQ_CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
        "TRIALQ_STOP_GRACE_S": "3",
    }
    cluster = start_workers(1, extra_env=env)
    # 40 steps of 0.3 s: still running when a loaded host's driver has seen three of them.
    space = grid("step_s", 0.3) + "\n" + grid("n_steps", 40)
    run.write_spec(_spec("saves_on_stop", space, 1, max_retries=0))
    driver = run.start()
    victim = worker_parent_running_a_trial(cluster)
    wait_until(lambda: _reported(run) >= 3, 120, "three steps of the trial")
    victim.send_signal(signal.SIGTERM)
    victim.wait(timeout=30)  # the trial saved and returned: no need to wait for the grace
    start_workers(1, extra_env=env)
    _, err = driver.communicate(timeout=240)
    assert_clean(run.judge("SIGTERM of a worker: preempted, resumed", 1))
    assert driver.returncode == 0, err
    (trial,) = run.study().trials
    attrs = trial.user_attrs
    assert attrs["outcome"] == "ok" and attrs["attempts"] == 2 and attrs["preemptions"] == 1
    starts = _starts(attrs["metrics"])
    assert starts[1] == 0 and starts[2] >= 3, starts


def test_a_trial_that_ignores_the_notice_is_killed_at_the_grace_and_counted_preempted(
    run: DriverRun, tmp_path: Path, start_workers: Callable[..., LocalCluster]
) -> None:
    env = {
        **FAST_HEARTBEAT,
        "TRIALQ_CHECKPOINT_ROOT": str(tmp_path / "checkpoints"),
        "TRIALQ_STOP_GRACE_S": "1",
    }
    cluster = start_workers(1, extra_env=env)
    space = grid("step_s", 0.3) + "\n" + grid("ignore_stop", 1) + "\n" + grid("n_steps", 40)
    run.write_spec(_spec("saves_on_stop", space, 1, max_retries=0))
    driver = run.start()
    victim = worker_parent_running_a_trial(cluster)
    wait_until(lambda: _reported(run) >= 3, 120, "three steps of the trial")
    victim.send_signal(signal.SIGTERM)
    victim.wait(timeout=30)
    start_workers(1, extra_env=env)
    _, err = driver.communicate(timeout=240)
    assert_clean(run.judge("SIGTERM, notice ignored: killed at grace", 1))
    assert driver.returncode == 0, err
    (trial,) = run.study().trials
    attrs = trial.user_attrs
    # max_retries = 0: a lost worker would have failed it; a preemption is re-sent.
    assert attrs["outcome"] == "ok" and attrs["attempts"] == 2 and attrs["preemptions"] == 1
    assert _starts(attrs["metrics"])[2] >= 3


def test_max_preemptions_bounds_the_re_sends(
    run: DriverRun, tmp_path: Path, start_workers: Callable[..., LocalCluster], redis_url: str
) -> None:
    env = {**FAST_HEARTBEAT, "TRIALQ_CHECKPOINT_ROOT": str(tmp_path / "checkpoints")}
    start_workers(1, extra_env=env)
    run.write_spec(_spec("stops_at_once", grid("x", 1), 1, max_preemptions=2))
    code, err = run.run()
    assert_clean(run.judge("preempted every time: max_preemptions", 1))
    (trial,) = run.study().trials
    attrs = trial.user_attrs
    assert trial.state.name == "FAIL" and attrs["outcome"] == "preempted"
    assert attrs["attempts"] == 3 and attrs["preemptions"] == 2
    assert "gave up after 2 preemptions" in attrs["error"]
    assert code == 1, err


def _reported(run: DriverRun) -> int:
    try:
        trials = run.study().trials
    except KeyError:
        return 0
    return max((len(t.intermediate_values) for t in trials), default=0)


def test_a_keras_fit_killed_after_epoch_7_resumes_at_epoch_8(
    run: DriverRun, tmp_path: Path, start_workers: Callable[..., LocalCluster]
) -> None:
    env = {**FAST_HEARTBEAT, "TRIALQ_CHECKPOINT_ROOT": str(tmp_path / "checkpoints")}
    start_workers(2, extra_env=env)
    logs = tmp_path / "epochs"
    logs.mkdir()
    space = grid("backup", 0, 1) + "\n" + grid("epochs_log", str(logs))
    spec = fault_spec("keras_killed_after_epoch_7", space, 2, max_retries=1, retry_crashes=True)
    run.write_spec(spec.replace("timeout_s = 60", "timeout_s = 300"))
    code, err = run.run(timeout=600)
    assert code == 0, err
    assert_clean(run.judge("Keras fit SIGKILLed after epoch 7", 2))
    epochs = {b: (logs / f"epochs-{b}.log").read_text().splitlines() for b in (0, 1)}
    print(f"epochs run in all: {len(epochs[1])} with the backup, {len(epochs[0])} without")
    assert len(epochs[1]) <= 11, epochs[1]  # 7, then 8-10 on attempt 2
    assert len(epochs[0]) == 17, epochs[0]  # 7, then all 10 again
    assert next(line.split()[1] for line in epochs[1] if line.startswith("2 ")) == "7"
