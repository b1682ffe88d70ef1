"""An Optuna objective, unchanged, on real workers: `trial.suggest_*` in the trial's process
answered by the driver's sampler on its live trial (real Redis, real worker processes, real
Optuna storage); the same function run by Optuna's own `study.optimize`."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
import redis
import trials

import trialq
from trialq.local import LocalCluster
from trialq.settings import Settings
from trialq.submit import submit_study
from trialq.trial.driver_questions import AttemptLost, DriverQuestions
from trialq.wire.channel import TrialAddress
from trialq.wire.signing import Seal
from trialq.wire.suggest import Answer, Question, QuestionChannel, float_distribution

pytestmark = pytest.mark.integration

OBJECTIVE_SPEC = """
    [study]
    name = "{name}"
    direction = "minimize"
    n_trials = {n}
    max_in_flight = {in_flight}
    sampler = "random"
    sampler_args = {{ seed = 3 }}
    [trial]
    entrypoint = "trials:{entrypoint}"
    """


def _run(spec: Path, redis_url: str, secret: str | None) -> dict[str, Any]:
    settings = Settings(broker_url=redis_url, result_secret=secret)
    return submit_study(spec, settings, None, None, None, False)


def _study(spec: Path, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{spec.parent / (name + '.db')}")


@pytest.fixture
def objective_study(
    write_spec: Callable[..., Path], start_workers: Callable[..., LocalCluster], redis_url: str
) -> Callable[..., optuna.Study]:
    """Run `n` trials of `trials:<entrypoint>` (an Optuna objective) on `workers` local
    workers, `in_flight` at once; the study, read back from its storage."""

    def run(name: str, entrypoint: str, n: int, in_flight: int, workers: int) -> optuna.Study:
        cluster = start_workers(workers)
        text = OBJECTIVE_SPEC.format(name=name, n=n, in_flight=in_flight, entrypoint=entrypoint)
        spec = write_spec(text)
        _run(spec, redis_url, cluster.result_secret)
        return _study(spec, name)

    return run


def test_the_objective_runs_on_workers_and_under_optuna_unchanged(
    objective_study: Callable[..., optuna.Study],
) -> None:
    study = objective_study("quad", "quadratic_objective", n=6, in_flight=2, workers=2)
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(complete) == 6
    for trial in complete:
        assert -10 <= trial.params["x"] <= 10
        assert trial.value == pytest.approx((trial.params["x"] - 2) ** 2)
        assert trial.distributions["x"] == optuna.distributions.FloatDistribution(-10, 10)
    assert len({t.params["x"] for t in complete}) == 6

    in_process = optuna.create_study()
    in_process.optimize(trials.quadratic_objective, n_trials=3)
    assert len(in_process.trials) == 3
    assert in_process.best_value == pytest.approx((in_process.best_params["x"] - 2) ** 2)


def test_user_attrs_and_optunas_older_suggest_names_as_in_optuna(
    objective_study: Callable[..., optuna.Study],
) -> None:
    on_workers = objective_study("whole", "objective_of_optunas_whole_trial_api", n=3,
                                 in_flight=1, workers=1)  # fmt: skip
    in_process = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    with pytest.warns(FutureWarning):  # Optuna's own: the older names are deprecated
        in_process.optimize(trials.objective_of_optunas_whole_trial_api, n_trials=3)

    for study in (on_workers, in_process):
        complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
        assert len(complete) == 3
        for trial in complete:
            assert trial.user_attrs["x_squared"] == pytest.approx(trial.params["x"] ** 2)
            assert trial.user_attrs["notes"] == {"lr": trial.params["lr"], "tags": ["a", "b"]}
            assert math.isnan(trial.user_attrs["val_loss_at_start"]), "stored as set, not null"
            assert trial.distributions["lr"] == optuna.distributions.FloatDistribution(
                1e-4, 1e-1, log=True
            )
            assert trial.distributions["q"].step == 0.25


def test_a_static_space_travels_with_the_task_after_the_first_trial(
    write_spec: Callable[..., Path], start_workers: Callable[..., LocalCluster], redis_url: str
) -> None:
    cluster = start_workers(1)
    text = OBJECTIVE_SPEC.format(name="carried", n=4, in_flight=1,
                                 entrypoint="objective_that_says_what_it_carried")  # fmt: skip
    spec = write_spec(
        text.replace('direction = "minimize"', 'direction = "minimize"\n    metric = "value"')
    )
    _run(spec, redis_url, cluster.result_secret)

    trials_ = _study(spec, "carried").trials
    assert [t.state.name for t in trials_] == ["COMPLETE"] * 4
    carried = [_metric(t, "carried") for t in trials_]
    assert carried == [0.0, 2.0, 2.0, 2.0], "the first asks both names, the rest carry them"
    for trial in trials_:
        assert set(trial.params) == {"x", "n"}
        assert trial.value == pytest.approx((trial.params["x"] - 2) ** 2 + trial.params["n"])


def _metric(trial: optuna.trial.FrozenTrial, name: str) -> float:
    """A returned metric, as the driver records it on the trial."""
    metrics = trial.user_attrs.get("metrics", trial.user_attrs)
    return float(metrics[name])


def test_a_conditional_space_records_only_what_each_branch_drew(
    objective_study: Callable[..., optuna.Study],
) -> None:
    study = objective_study("cond", "conditional_objective", n=10, in_flight=2, workers=2)

    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(complete) == 10
    kinds = {t.params["kind"] for t in complete}
    assert kinds == {"linear", "tree"}, "seed 3 draws both branches in 10 trials"
    for trial in complete:
        drawn = "alpha" if trial.params["kind"] == "linear" else "depth"
        assert trial.value == pytest.approx(float(trial.params[drawn]))


def test_a_name_asked_with_another_distribution_is_optunas_own_error(
    objective_study: Callable[..., optuna.Study],
) -> None:
    (trial,) = objective_study("twice", "asks_x_two_ways", n=1, in_flight=1, workers=1).trials
    assert trial.state.name == "FAIL"
    assert (
        "Cannot set different distribution kind to the same parameter name"
        in (trial.user_attrs["error"])
    )
    assert trial.params == {"x": pytest.approx(trial.params["x"])}


def test_a_suggest_no_driver_answers_ends_the_attempt_as_lost(redis_url: str) -> None:
    channel = QuestionChannel(redis.Redis.from_url(redis_url), Seal("s" * 32))
    questions = DriverQuestions(channel, TrialAddress("gone", 0, 1), suggest_wait_s=0.5)
    with pytest.raises(AttemptLost, match=r"no answer from the driver within 0\.5 s"):
        questions.suggest("x", float_distribution(0, 1, None, False))


def test_a_question_or_answer_under_another_secret_is_refused(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    trial_side = QuestionChannel(client, Seal("a" * 32))
    driver_side = QuestionChannel(client, Seal("b" * 32))
    question = Question(TrialAddress("s", 0, 1), 1, "suggest", "x",
                        float_distribution(0, 1, None, False))  # fmt: skip
    trial_side._push(question)
    assert driver_side.take("s", 0.5) == [], "a forged question is not answered"

    driver_side.answer(question, Answer(value=0.5))
    raw = client.lpop(question.answer_key())
    assert raw is not None
    assert trial_side._trusted_answer(question, raw) is None, "a forged answer is none"
    assert QuestionChannel(client, Seal("a" * 32))._trusted_answer(question, raw) is None


FAST_EPOCHS_SPEC = """
    [study]
    name = "fast"
    direction = "maximize"
    n_trials = 20
    max_in_flight = 1
    sampler = "random"
    sampler_args = { seed = 7 }
    pruner = "median"
    pruner_args = { n_startup_trials = 3, n_warmup_steps = 1 }
    [trial]
    entrypoint = "trials:fast_epochs_objective"
    """


def test_fast_epochs_prune_as_optuna_prunes_in_one_process(
    write_spec: Callable[..., Path], start_workers: Callable[..., LocalCluster], redis_url: str
) -> None:
    """8 epochs in about 0.25 s: `should_prune()` answers for the step just reported, so the
    study prunes what Optuna's own `study.optimize` prunes with the same sampler, pruner and
    seed (within one), where a flag raised a pass later pruned none."""
    cluster = start_workers(1)
    spec = write_spec(FAST_EPOCHS_SPEC)
    _run(spec, redis_url, cluster.result_secret)
    queued = _study(spec, "fast").trials

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    in_process = optuna.create_study(
        direction="maximize",
        sampler=optuna.samplers.RandomSampler(seed=7),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=1),
    )
    in_process.optimize(trials.fast_epochs_objective, n_trials=20)

    def pruned(trials_: list[optuna.trial.FrozenTrial]) -> int:
        return sum(t.state is optuna.trial.TrialState.PRUNED for t in trials_)

    assert pruned(in_process.trials) >= 3, "the case prunes in one process"
    assert abs(pruned(queued) - pruned(in_process.trials)) <= 1, (
        [(t.state.name, max(t.intermediate_values, default=None)) for t in queued],
        [(t.state.name, max(t.intermediate_values, default=None)) for t in in_process.trials],
    )


def test_an_objective_of_a_script_runs_unchanged_on_local_workers(tmp_path: Path) -> None:
    """`study.optimize(objective, n_trials=...)` become `trialq.optimize(objective, ...)`:
    the function of `__main__` is carried to the workers, signed with `--local`'s secret,
    and each call runs `n_trials` more, as Optuna's does; the study back is Optuna's own
    (`best_params`, `trials_dataframe()`); another function of the same name
    is refused in one line, not handed the first one's study."""
    script = tmp_path / "search.py"
    script.write_text(
        textwrap.dedent("""
        import trialq
        OFFSET = 2
        def objective(trial):
            x = trial.suggest_float("x", -10, 10)
            return (x - OFFSET) ** 2
        study = trialq.optimize(objective, n_trials=3, progress=False)
        study = trialq.optimize(objective, n_trials=2, progress=False)
        print(len(study.trials), study.best_params["x"], study.best_value)
        print(sum(t.state.name == "COMPLETE" for t in study.trials))
        frame = study.trials_dataframe()
        print(len(frame), sorted(c for c in frame.columns if c.startswith(("params_", "value"))))
        def objective(trial):  # another function under the same name: not its study
            return trial.suggest_float("y", 0, 1)
        try:
            trialq.optimize(objective, n_trials=2, progress=False)
        except trialq.UsageError as exc:
            print(exc)
        """)
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)  # fmt: skip

    assert done.returncode == 0, done.stderr
    count, x, value = done.stdout.splitlines()[0].split()
    assert int(count) == 5, "3, then 2 more"
    assert float(value) == pytest.approx((float(x) - 2) ** 2)
    assert done.stdout.splitlines()[1] == "5"
    assert done.stdout.splitlines()[2] == "5 ['params_x', 'value']", "Optuna's own dataframe"
    refusal = done.stdout.splitlines()[3:]
    assert len(refusal) == 1, done.stdout
    assert refusal[0].startswith(
        "trialq.optimize(): the study 'objective' was run with the trial function "
        "__main__:objective (source "
    ), refusal
    assert "give this one another study name (name=...)" in refusal[0]
    logs = "".join(p.read_text() for p in tmp_path.glob("objective-logs/*/worker*.log"))
    assert "trial functions carried as code: accepted when signed" in logs


def test_a_worker_that_takes_no_code_refuses_a_carried_function_unrun(
    start_workers: Callable[..., LocalCluster], redis_url: str, tmp_path: Path
) -> None:
    cluster = start_workers(1, extra_env={"TRIALQ_ACCEPT_CODE": "0"})
    marker = tmp_path / "ran"

    def objective(trial: Any) -> float:
        marker.touch()
        return float(trial.suggest_float("x", 0, 1))

    objective.__module__ = "__main__"
    spec = trialq.study_spec(objective, n_trials=2, max_failures_in_a_row=2, directory=tmp_path)

    with pytest.raises(trialq.TrialqError, match="refused by their workers"):
        trialq.run(spec, broker=redis_url, progress=False)

    assert not marker.exists(), "nothing of the function ran"
    logs = "".join(p.read_text() for p in cluster.log_dir.glob("worker*.log"))
    assert "trial functions carried as code: refused (TRIALQ_ACCEPT_CODE=1 accepts" in logs
