"""The Python API: a study from keyword arguments (or a spec file), run from a script or a
notebook cell, and the `optuna.Study` back (docs/python-api.md).

Keyword arguments are the spec's keys, checked by the same model and refused in the same one
line (`UsageError`, naming the argument). A trial function is sent by name where the
workers can import it; one defined in `__main__` or a notebook is carried to them as code,
signed (`trialq.wire.carried_code`); a lambda, a nested function or a method is refused in
one line that says what to do. The run itself is
`submit-study`'s (`trialq.submit.run_study`), imported when a study runs: `import trialq`
stays light.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trialq.errors import Interrupted, UsageError
from trialq.spec import (
    STUDY_NAME,
    StudySection,
    StudySpec,
    TrialSection,
    spec_from_mapping,
)
from trialq.spec import load_spec as load_spec_file
from trialq.wire.carried_code import CARRIED_MODULE, packed, source_hash

if TYPE_CHECKING:
    import optuna

WHERE = "trialq.optimize()"
"""What a mistake in the arguments is said to be in."""
TOP_LEVEL = ("space", "enqueue", "tracking")
"""Arguments that are spec tables of their own rather than `[study]` or `[trial]` keys."""
TRACKERS = ("mlflow", "wandb", "tensorboard")
"""Shorthand arguments for `tracking={...}`'s tables (`tensorboard=True`)."""
_SHORTHAND_KEY = {"mlflow": "tracking_uri", "wandb": "project", "tensorboard": "log_dir"}
"""What a string given for a tracker names (`mlflow="sqlite:///mlflow.db"`)."""
DEFAULT_LOCAL_WORKERS = 2
"""Local workers when `workers` is not given (as `submit-study --local`)."""

TrialFunction = Callable[..., Any] | str


def optimize(
    trial: TrialFunction,
    *,
    space: Mapping[str, Any] | None = None,
    local: bool | None = None,
    broker: str | None = None,
    workers: int | None = None,
    storage: str | None = None,
    directory: str | Path | None = None,
    progress: bool = True,
    verbose: bool = False,
    **spec_keys: Any,
) -> optuna.Study:
    """Run a study of `trial` (a function the workers import, or `"module:function"`) over
    `space` and return it. `spec_keys` are the spec's `[study]` and `[trial]` keys
    (`n_trials`, `metric`, `direction`, `max_in_flight`, `timeout_s`, ...), `enqueue` and
    `tracking` (or `mlflow=`, `wandb=`, `tensorboard=`). The study runs on local workers
    (`submit-study --local`) unless `broker` names a Redis its workers consume. `directory`
    (default: the current one) holds the default SQLite storage, the local logs and
    checkpoints, as a spec file's folder does.

    With no `space`, `trial` is an Optuna objective (`objective(trial)`, drawing its params
    with `trial.suggest_*`), and `n_trials` means what it means to `study.optimize`: that
    many more each call. With a `space`, it is the spec's: the study's finished trials to
    reach (docs/python-api.md)."""
    spec = _study_spec(trial, WHERE, space=space, directory=directory, **spec_keys)
    more = _finished_before(spec, storage) + spec.study.n_trials if spec.trial_suggests else None
    return run(spec, local=local, broker=broker, workers=workers, storage=storage,
               n_trials=more, progress=progress, verbose=verbose)  # fmt: skip


def study_spec(
    trial: TrialFunction,
    *,
    space: Mapping[str, Any] | None = None,
    directory: str | Path | None = None,
    **spec_keys: Any,
) -> StudySpec:
    """The spec `optimize` runs, checked as a spec file is (nothing runs)."""
    return _study_spec(trial, "trialq.study_spec()", space=space, directory=directory,
                       **spec_keys)  # fmt: skip


def _study_spec(
    trial: TrialFunction,
    where: str,
    *,
    space: Mapping[str, Any] | None = None,
    directory: str | Path | None = None,
    **spec_keys: Any,
) -> StudySpec:
    """The spec of `trial`, its mistakes said as `where`'s."""
    entrypoint = entrypoint_of(trial, where)
    spec_keys.setdefault("name", _default_name(entrypoint))
    tables = spec_tables({"entrypoint": entrypoint, "space": space or {}, **spec_keys}, where)
    folder = Path(directory) if directory is not None else Path.cwd()
    path = folder / f"{spec_keys['name']}.toml"  # anchors relative paths; need not exist
    spec = spec_from_mapping(tables, path, origin=where, key_name=argument_name)
    if entrypoint.startswith(f"{CARRIED_MODULE}:") and callable(trial):
        return spec.carrying(packed(trial), source_hash(trial))
    return spec


def load_spec(path: str | Path, **overrides: Any) -> StudySpec:
    """A spec file, checked, with `overrides` (the same keyword arguments as `optimize`'s
    spec keys) in place of its keys: `trialq.run(trialq.load_spec("study.toml", n_trials=5))`."""
    spec = load_spec_file(Path(path))
    if not overrides:
        return spec
    tables = spec.model_dump(mode="json", exclude={"path"}, exclude_defaults=True)
    for section, keys in spec_tables(overrides).items():
        if isinstance(tables.get(section), dict) and isinstance(keys, dict):
            tables[section] = {**tables[section], **keys}
        else:
            tables[section] = keys
    return spec_from_mapping(tables, Path(path), origin=f"{path} (with {WHERE} arguments)",
                             key_name=argument_name)  # fmt: skip


def run(
    spec: StudySpec | str | Path,
    *,
    local: bool | None = None,
    broker: str | None = None,
    workers: int | None = None,
    storage: str | None = None,
    n_trials: int | None = None,
    progress: bool = True,
    verbose: bool = False,
) -> optuna.Study:
    """Run a spec (a `StudySpec`, or a spec file's path) as `submit-study` does, and return
    the study read from its storage. Ctrl-C (or interrupting a notebook's kernel) stops the
    run as on the command line, then raises `KeyboardInterrupt`."""
    if not isinstance(spec, StudySpec):
        spec = load_spec(spec)
    local_workers = _local_workers(local, broker, workers)
    from trialq import submit
    from trialq.settings import settings_with_broker

    settings = settings_with_broker(broker)
    if verbose or settings.log_level:  # as `-v` does: trialq's own lines on stderr
        from trialq import logs

        logs.to_stderr(settings.log_level or "INFO")
    try:
        options = submit.RunOptions(storage_override=storage, n_trials=n_trials,
                                    local_workers=local_workers, show_progress=progress,
                                    verbose=verbose)  # fmt: skip
        study_run = submit.run_study(spec, settings, options)
    except Interrupted as exc:
        print(exc, file=sys.stderr)
        raise KeyboardInterrupt(str(exc)) from None
    return study_run.load()


def _finished_before(spec: StudySpec, storage: str | None) -> int:
    """The study's finished trials before this call (0 where it does not exist yet)."""
    import optuna

    from trialq.driver.study import storage_url
    from trialq.settings import Settings

    url = storage_url(spec, storage, Settings().storage)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return 0
    try:
        study = optuna.load_study(study_name=spec.study.name, storage=url)
    except KeyError:  # no such study yet
        return 0
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED,
              optuna.trial.TrialState.FAIL)  # fmt: skip
    return len(study.get_trials(deepcopy=False, states=states))


def _local_workers(local: bool | None, broker: str | None, workers: int | None) -> int | None:
    """How many local workers to start; None to use a broker's workers (`broker`, else
    `TRIALQ_BROKER_URL` with `local=False`)."""
    if local and broker is not None:
        raise UsageError(f"{WHERE}: local=True and broker exclude each other")
    if broker is None and local is not False:
        return workers or DEFAULT_LOCAL_WORKERS
    if workers is not None:
        raise UsageError(f"{WHERE}: workers starts local workers: it excludes broker")
    return None


def _default_name(entrypoint: str) -> str:
    """A study is named after its trial function unless `name` says otherwise."""
    function = entrypoint.rpartition(":")[2].strip()
    return function if STUDY_NAME.fullmatch(function) else "study"


def entrypoint_of(trial: TrialFunction, where: str = WHERE) -> str:
    """`module:function` for a function the workers import by name; `__main__:function` for
    one defined in `__main__` (a script, a notebook cell), which is carried to them as code
    (`trialq.wire.carried_code`); one line saying what to do for any other."""
    if isinstance(trial, str):
        return trial
    module = getattr(trial, "__module__", None)
    qualname = getattr(trial, "__qualname__", None)
    name = getattr(trial, "__name__", None) or repr(trial)
    if name == "<lambda>":
        raise UsageError(
            f"{where}: the trial function is a lambda, which names no study and no trial "
            "function in its records: define it with def (in a notebook cell is fine) and "
            "pass that function"
        )
    if module in ("__main__", "__mp_main__") and name.isidentifier():
        return f"{CARRIED_MODULE}:{name}"
    if module is None or not qualname or not qualname.isidentifier():
        raise UsageError(
            f"{where}: {qualname or name} is a nested function or a method, which the "
            f"workers cannot import by name: define it at the top level of a module "
            f"({module}), or in this script or notebook, and pass that function"
        )
    return f"{module}:{qualname}"


def spec_tables(arguments: Mapping[str, Any], where: str = WHERE) -> dict[str, Any]:
    """Keyword arguments as the spec's tables: each `[study]` or `[trial]` key into its table,
    `space`, `enqueue` and `tracking` as they are. An unknown one is refused, with the name
    it looks like a typo of."""
    tables: dict[str, Any] = {}
    for key, value in arguments.items():
        if key in StudySection.model_fields:
            tables.setdefault("study", {})[key] = value
        elif key in TrialSection.model_fields:
            tables.setdefault("trial", {})[key] = value
        elif key == "space":
            tables["space"] = space_tables(value)
        elif key in TOP_LEVEL:
            tables[key] = value
        elif key in TRACKERS:
            shorthand = {_SHORTHAND_KEY[key]: value} if isinstance(value, str) else value
            tables.setdefault("tracking", {})[key] = shorthand
        else:
            raise UsageError(f"{where}: {key}: unknown argument{_did_you_mean(key)}")
    return tables


def space_tables(space: Any) -> Any:
    """`space` as `[space.*]` tables: each a table as in a spec file, a list of choices
    (categorical), or an Optuna distribution."""
    if not isinstance(space, Mapping):
        return space  # refused by the model, in its words
    return {name: _param_table(value) for name, value in space.items()}


def _param_table(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return {"type": "categorical", "choices": list(value)}
    kind = type(value).__name__
    if kind == "FloatDistribution":
        return {"type": "float", "low": value.low, "high": value.high, "log": value.log,
                "step": value.step}  # fmt: skip
    if kind == "IntDistribution":
        return {"type": "int", "low": value.low, "high": value.high, "log": value.log,
                "step": value.step}  # fmt: skip
    if kind == "CategoricalDistribution":
        return {"type": "categorical", "choices": list(value.choices)}
    return value


def argument_name(loc: tuple[int | str, ...]) -> str:
    """A spec key as the argument that gave it: `study.n_trials` is `n_trials`,
    `trial.entrypoint` the trial function; `space.x.low` stays itself."""
    if len(loc) >= 2 and loc[0] in ("study", "trial"):
        key = "trial" if loc[1] == "entrypoint" else str(loc[1])
        return ".".join([key, *(str(part) for part in loc[2:])])
    return ".".join(str(part) for part in loc)


def _did_you_mean(key: str) -> str:
    known = [*StudySection.model_fields, *TrialSection.model_fields, *TOP_LEVEL, *TRACKERS]
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""
