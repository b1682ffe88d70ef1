"""The Python API's refusals and its spec: keyword arguments are checked by the spec's own
model, with the same one-line errors a spec file gets; a trial function the workers cannot
import by name is refused in one line that says how to make it importable."""

from __future__ import annotations

import base64
import pickle
import tempfile
import textwrap
import tomllib
from pathlib import Path
from typing import Any

import optuna
import pytest
import trials
from bad_inputs import BAD_SPECS

import trialq
from trialq.api import study_spec
from trialq.errors import EntrypointRefused, SpecError, UsageError
from trialq.spec import load_spec
from trialq.wire import carried_code
from trialq.wire.signing import Seal

SPACE = {"x": {"type": "float", "low": 0, "high": 1}}


class _Trainer:
    def train(self, params: dict[str, Any]) -> float:
        return 0.0


def _error(trial: Any = trials.quadratic, **keys: Any) -> str:
    with pytest.raises(UsageError) as raised:
        study_spec(trial, **{"space": SPACE, "n_trials": 3, "metric": "score", **keys})
    message = str(raised.value)
    assert len(message.splitlines()) == 1, message
    return message


def test_a_module_function_is_sent_by_its_module_and_name() -> None:
    spec = study_spec(trials.quadratic, space=SPACE, n_trials=3, metric="score")

    assert str(spec.trial.entrypoint) == "trials:quadratic"
    assert spec.study.name == "quadratic", "the study is named after the function by default"
    assert spec.study.n_trials == 3
    assert spec.space["x"].type == "float"
    assert spec.where == "trialq.study_spec()", "its errors name the call that was made"
    assert spec.directory == Path.cwd()


def test_a_function_of_main_is_carried_as_code_that_unpickles_to_it() -> None:
    def train(params: dict[str, Any], trial: Any) -> float:
        return params["x"] * 2

    train.__module__, train.__qualname__ = "__main__", "train"

    spec = study_spec(train, space=SPACE, n_trials=3)

    assert str(spec.trial.entrypoint) == "__main__:train"
    assert spec.study.name == "train"
    assert spec.carried_code is not None
    seal = Seal("k" * 32)
    signed = carried_code.signature(seal, spec.carried_code)
    carried = carried_code.loaded(spec.carried_code, signed, seal, accepts=True)
    assert carried({"x": 1.5}, None) == 3.0


@pytest.mark.parametrize(
    ("signed_with", "accepts", "refusal"),
    [
        (None, True, "unsigned"),
        ("another secret, as long", True, "does not verify"),
        ("k" * 32, False, "does not accept code: start it with TRIALQ_ACCEPT_CODE=1"),
    ],
    ids=["unsigned", "wrong-secret", "not-accepting"],
)
def test_carried_code_not_signed_with_the_workers_secret_is_refused_unloaded(
    signed_with: str | None, accepts: bool, refusal: str, tmp_path: Path
) -> None:
    """Unpickling runs code: nothing of a refused payload is loaded."""
    marker = tmp_path / "ran"

    class Bomb:
        def __reduce__(self) -> tuple[Any, ...]:
            return (Path.touch, (marker,))

    payload = base64.b64encode(pickle.dumps(Bomb())).decode()
    signature = None if signed_with is None else carried_code.signature(Seal(signed_with), payload)

    with pytest.raises(EntrypointRefused, match=refusal) as refused:
        carried_code.loaded(payload, signature, Seal("k" * 32), accepts)

    assert len(str(refused.value).splitlines()) == 1
    assert not marker.exists(), "nothing of it ran"


def test_a_lambda_is_refused_as_a_lambda() -> None:
    message = _error(lambda trial: 0.0)

    assert message.startswith("trialq.study_spec(): the trial function is a lambda")
    assert "define it with def" in message
    assert "__main__" not in message


@pytest.mark.parametrize(
    "function", ["nested", _Trainer().train, "".upper], ids=["nested", "method", "builtin"]
)
def test_a_nested_function_or_method_is_refused(function: Any) -> None:
    if function == "nested":

        def nested(params: dict[str, Any]) -> float:
            return 0.0

        function = nested

    message = _error(function)

    assert "the workers cannot import by name" in message


def test_a_misspelt_argument_is_named_with_the_key_it_looks_like() -> None:
    assert _error(n_trails=3) == (
        "trialq.study_spec(): n_trails: unknown argument (did you mean n_trials?)"
    )


def _cases_a_spec_file_refuses_on_loading() -> list[str]:
    """BAD_SPECS' cases that `load_spec` refuses (others are refused later in a run, as
    they are for a file) and that keyword arguments can express (TOML, known tables)."""
    cases = []
    with tempfile.TemporaryDirectory() as folder:
        for case, (text, _) in sorted(BAD_SPECS.items()):
            try:
                tables = tomllib.loads(text)
            except tomllib.TOMLDecodeError:
                continue
            known = {"study", "trial", "space", "enqueue", "tracking"}
            if set(tables) <= known and _refused(text, folder):
                cases.append(case)
    return cases


def _refused(text: str, folder: str) -> bool:
    path = Path(folder) / "study.toml"
    path.write_text(text)
    try:
        load_spec(path)
    except SpecError:
        return True
    return False


@pytest.mark.parametrize("case", _cases_a_spec_file_refuses_on_loading())
def test_arguments_are_refused_as_the_same_keys_of_a_spec_file(case: str, tmp_path: Path) -> None:
    """The spec's model checks both: the line is the file's, with the argument's name for
    the key (`n_trials`, not `study.n_trials`)."""
    text, _ = BAD_SPECS[case]
    path = tmp_path / "study.toml"
    path.write_text(text)
    with pytest.raises(SpecError) as refused:
        load_spec(path)
    from_file = str(refused.value).removeprefix(f"{path}: ")
    tables = tomllib.loads(text)
    arguments = {**tables.get("study", {}), **tables.get("trial", {})}
    arguments |= {key: tables[key] for key in ("space", "enqueue", "tracking") if key in tables}
    entrypoint = arguments.pop("entrypoint", "trials:quadratic")

    with pytest.raises(UsageError) as raised:
        study_spec(entrypoint, directory=tmp_path, **arguments)

    expected = from_file.replace("study.", "", 1) if from_file.startswith("study.") else from_file
    expected = expected.replace("trial.entrypoint", "trial").replace("trial.", "", 1)
    got = str(raised.value).replace("unknown argument", "unknown key")
    assert got == f"trialq.study_spec(): {expected}"


def test_a_space_may_be_lists_of_choices_or_optuna_distributions() -> None:
    spec = study_spec(
        "trials:quadratic",
        space={
            "lr": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True),
            "units": optuna.distributions.IntDistribution(8, 64, step=8),
            "act": ["relu", "tanh"],
            "opt": optuna.distributions.CategoricalDistribution(["adam", "sgd"]),
        },
        n_trials=2,
        metric="score",
    )

    assert spec.space["lr"].model_dump() == {
        "type": "float", "low": 1e-4, "high": 1e-1, "log": True, "step": None,
    }  # fmt: skip
    assert (spec.space["units"].low, spec.space["units"].step) == (8, 8)
    assert spec.space["act"].choices == ("relu", "tanh")
    assert spec.space["opt"].choices == ("adam", "sgd")


def test_tracking_is_a_table_or_a_shorthand_argument() -> None:
    spec = study_spec(trials.quadratic, space=SPACE, n_trials=2, metric="score",
                      tensorboard=True, mlflow="sqlite:///mlflow.db")  # fmt: skip

    assert spec.tracking.names == ("mlflow", "tensorboard")
    assert spec.tracking.mlflow is not None
    assert spec.tracking.mlflow.tracking_uri == "sqlite:///mlflow.db"
    assert _error(tracking={"tensorbord": True}) == (
        "trialq.study_spec(): tracking.tensorbord: unknown key (did you mean tensorboard?)"
    )


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        ({"local": True, "broker": "redis://x"}, "local=True and broker exclude each other"),
        ({"broker": "redis://x", "workers": 2}, "workers starts local workers"),
    ],
)
def test_where_to_run_is_refused_when_it_contradicts_itself(
    where: dict[str, Any], expected: str
) -> None:
    with pytest.raises(UsageError, match=expected):
        trialq.optimize(trials.quadratic, space=SPACE, n_trials=2, metric="score", **where)


def test_a_spec_file_loads_with_arguments_in_place_of_its_keys(tmp_path: Path) -> None:
    path = tmp_path / "study.toml"
    path.write_text(
        textwrap.dedent("""
        [study]
        name = "s"
        n_trials = 3
        metric = "score"
        [trial]
        entrypoint = "trials:quadratic"
        [space.x]
        type = "float"
        low = 0
        high = 1
    """)
    )

    spec = trialq.load_spec(path, n_trials=7, timeout_s=60, tensorboard=True)

    assert (spec.study.n_trials, spec.study.metric, spec.trial.timeout_s) == (7, "score", 60)
    assert spec.tracking.names == ("tensorboard",)
    assert spec.path == path.resolve()
    with pytest.raises(UsageError, match=r"study.toml \(with trialq.optimize\(\) arguments\): "
                                         r"n_trials: Input should be greater than 0"):  # fmt: skip
        trialq.load_spec(path, n_trials=0)
