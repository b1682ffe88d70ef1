"""The parts of `[study] ask_processes` that need no process (issue 42): the changes the driver
hands on, an ask process's copy of the study (`Replica`), and the samplers it is refused for.
The processes themselves: tests/unit/test_ask_processes.py."""

from __future__ import annotations

import textwrap
from pathlib import Path

import optuna
import pytest

from trialq.driver.asking import replica as replica_module
from trialq.driver.asking.changes import ChangeFeed
from trialq.driver.asking.replica import Replica
from trialq.driver.study import make_sampler
from trialq.errors import SpecError
from trialq.spec import StudySpec, load_spec

TrialState = optuna.trial.TrialState
X = optuna.distributions.FloatDistribution(0.0, 1.0)
COLOUR = optuna.distributions.CategoricalDistribution(["red", "green", "blue"])


def _spec(tmp_path: Path, sampler: str = "tpe", space: str = "", more: str = "") -> StudySpec:
    path = tmp_path / "study.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            [study]
            name = "asking"
            direction = "minimize"
            n_trials = 500
            max_in_flight = 4
            sampler = "{sampler}"
            ask_processes = 2
            {more}
            [trial]
            entrypoint = "trials:quadratic"
            """
        )
        + textwrap.dedent(
            space
            or """
            [space.x]
            type = "float"
            low = 0
            high = 1
            """
        )
    )
    return load_spec(path)


def _finished(number: int, x: float) -> optuna.trial.FrozenTrial:
    return optuna.trial.create_trial(
        params={"x": x}, distributions={"x": X}, value=(x - 0.3) ** 2
    ).__class__(
        number=number, state=TrialState.COMPLETE, value=(x - 0.3) ** 2, values=None,
        datetime_start=None, datetime_complete=None, params={"x": x}, distributions={"x": X},
        user_attrs={}, system_attrs={}, intermediate_values={}, trial_id=number,
    )  # fmt: skip


def _running(number: int, params: dict[str, object], space: dict[str, object]) -> object:
    return optuna.trial.FrozenTrial(
        number=number, state=TrialState.RUNNING, value=None, values=None, datetime_start=None,
        datetime_complete=None, params=params, distributions=space, user_attrs={},
        system_attrs={}, intermediate_values={}, trial_id=number,
    )  # fmt: skip


def _states(replica: Replica) -> list[TrialState]:
    return [t.state for t in replica.study.get_trials(deepcopy=False)]


def test_the_feed_hands_on_each_new_or_changed_trial_once_slimmed() -> None:
    study = optuna.create_study()
    first = study.ask({"x": X})
    study.set_user_attr("kept", "study-level")
    first.set_user_attr("task_id", "t-1")
    feed = ChangeFeed()

    assert [t.number for t in feed.changes(study)] == [0]
    assert feed.changes(study) == [], "an unchanged trial was handed on again"

    study.tell(first, 0.5)
    second = study.ask({"x": X})
    changed = feed.changes(study)

    assert [(t.number, t.state) for t in changed] == [(0, TrialState.COMPLETE),
                                                     (1, TrialState.RUNNING)]  # fmt: skip
    assert changed[0].values == [0.5] and changed[0].params == first.params
    assert changed[0].user_attrs == {}, "user attrs are no sampler's business"
    study.tell(second, 0.1)
    assert [t.number for t in feed.changes(study)] == [1]
    assert feed.changes(study) == []


def test_an_enqueued_trial_counts_as_running_and_is_handed_on_again_with_its_params() -> None:
    study = optuna.create_study()
    study.enqueue_trial({"x": 0.25})
    feed = ChangeFeed()

    (waiting,) = feed.changes(study)
    assert waiting.state is TrialState.RUNNING and waiting.params == {}

    study.ask({"x": X})  # the driver's own ask pops it and sets its params
    (popped,) = feed.changes(study)
    assert popped.number == 0 and popped.params == {"x": 0.25}


def test_a_draw_runs_in_the_copy_until_settled_and_driver_trials_follow_their_changes(
    tmp_path: Path,
) -> None:
    spec = _spec(tmp_path)
    replica = Replica(spec, seed=1, trials=[_finished(n, n / 20) for n in range(12)])

    asked = replica.ask()

    assert set(asked.params) == {"x"} and 0.0 <= asked.params["x"] <= 1.0
    assert asked.distributions == {"x": X}
    assert _states(replica).count(TrialState.RUNNING) == 1, "the draw is not running in the copy"

    replica.apply([_running(12, {"x": 0.9}, {"x": X})], settled=[asked.ask_id])
    assert _states(replica).count(TrialState.RUNNING) == 1, "settled, the draw still runs"
    assert _states(replica).count(TrialState.FAIL) == 1

    replica.apply([_finished(12, 0.9)], settled=[])
    held = replica.study.get_trials(deepcopy=False)[-1]
    assert held.state is TrialState.COMPLETE and held.value == pytest.approx(0.36)


def test_a_draw_keeps_off_the_params_of_every_trial_in_flight(tmp_path: Path) -> None:
    """Two of three colours run in the driver: the copy's sampler (TPE behind
    `DistinctFromRunning`, as in the driver) draws the third."""
    space = """
    [space.colour]
    type = "categorical"
    choices = ["red", "green", "blue"]
    """
    spec = _spec(tmp_path, space=space)
    done = [
        optuna.trial.create_trial(params={"colour": c}, distributions={"colour": COLOUR}, value=v)
        for c, v in [("red", 1.0), ("green", 2.0), ("blue", 3.0)] * 4
    ]
    for number, trial in enumerate(done):
        trial.number = number
    flying = [_running(12, {"colour": "red"}, {"colour": COLOUR}),
              _running(13, {"colour": "green"}, {"colour": COLOUR})]  # fmt: skip

    for seed in range(5):
        replica = Replica(spec, seed=seed, trials=[*done, *flying])
        assert replica.ask().params == {"colour": "blue"}, seed


def test_each_ask_process_draws_from_a_seed_of_its_own(tmp_path: Path) -> None:
    spec = _spec(tmp_path, more="sampler_args = { seed = 7 }")
    trials = [_finished(n, n / 20) for n in range(12)]

    draws = {seed: Replica(spec, seed, trials).ask().params["x"] for seed in (8, 9)}

    assert draws[8] != draws[9]
    assert Replica(spec, 8, trials).ask().params["x"] == draws[8], "a seed did not repeat"


@pytest.mark.parametrize("sampler", ["random", "gp", "cmaes", "grid"])
def test_ask_processes_are_refused_for_every_sampler_but_tpe(tmp_path: Path, sampler: str) -> None:
    spec = _spec(tmp_path, sampler=sampler)

    with pytest.raises(SpecError, match=r"study\.ask_processes: only TPE") as raised:
        make_sampler(spec)

    assert repr(sampler) in str(raised.value) and "\n" not in str(raised.value)


def test_auto_is_tpe_and_takes_ask_processes(tmp_path: Path) -> None:
    spec = _spec(tmp_path, sampler="auto")

    make_sampler(spec)  # TPE: accepted


def test_the_copy_is_made_again_from_what_tpe_reads_once_it_holds_too_many(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past `REBUILD_PAST` trials the copy keeps the best, the latest and the unfinished
    (here 2 + 5 + 2): a draw not yet settled and a driver trial still running go on being
    followed in the new copy."""
    monkeypatch.setattr(replica_module, "KEPT_BEST", 2)
    monkeypatch.setattr(replica_module, "KEPT_RECENT", 5)
    monkeypatch.setattr(replica_module, "REBUILD_PAST", 20)
    spec = _spec(tmp_path)
    replica = Replica(spec, seed=1, trials=[_finished(n, n / 20) for n in range(12)])
    asked = replica.ask()
    replica.apply([_running(12, {"x": 0.5}, {"x": X})], settled=[])

    replica.apply([_finished(n, n / 100) for n in range(13, 21)], settled=[])

    held = replica.study.get_trials(deepcopy=False)
    assert [t.number for t in held] == list(range(len(held))) and len(held) == 2 + 5 + 2
    assert sorted(t.value for t in held if t.value is not None)[:2] == [
        0.0, pytest.approx(0.0025),  # x = 0.3, then 0.25 or 0.35: the best two
    ]  # fmt: skip
    replica.apply([_finished(12, 0.5)], settled=[asked.ask_id])
    states = _states(replica)
    assert TrialState.RUNNING not in states and states.count(TrialState.FAIL) == 1
    assert replica.ask().params.keys() == {"x"}


def test_a_define_by_run_space_is_drawn_by_its_function_in_the_copy(tmp_path: Path) -> None:
    (tmp_path / "spaces.py").write_text(
        "def space(trial):\n"
        "    if trial.suggest_categorical('kind', ['linear', 'deep']) == 'deep':\n"
        "        trial.suggest_int('layers', 2, 8)\n"
    )
    spec = _spec(tmp_path, space=" ", more='search_space = "spaces:space"')
    kind = optuna.distributions.CategoricalDistribution(["linear", "deep"])
    done = [
        optuna.trial.create_trial(params={"kind": "linear"}, distributions={"kind": kind}, value=1)
        for _ in range(12)
    ]
    for number, trial in enumerate(done):
        trial.number = number

    draws = [Replica(spec, seed, done).ask() for seed in range(6)]

    for asked in draws:
        assert asked.params["kind"] in ("linear", "deep")
        assert ("layers" in asked.params) == (asked.params["kind"] == "deep"), asked.params
        assert set(asked.distributions) == set(asked.params)
