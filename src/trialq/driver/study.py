"""Opening the Optuna study a spec describes: storage, directions, sampler and pruner.

Only the driver writes to studies (`status` and `report` read them); workers never reach
the storage.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import sqlite3
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy

from trialq.driver._storage.columns import name_columns
from trialq.driver._storage.engine import rdb_storage
from trialq.driver._storage.mirror import mirrored, rdb_under
from trialq.driver.outage import FIRST_RETRY_S, LONGEST_RETRY_S
from trialq.driver.pruner_args import check_pruner_args, rehearse
from trialq.driver.sampling.args import check_sampler_args
from trialq.driver.sampling.distinct import DistinctFromRunning
from trialq.driver.sampling.gp import OneThreadGP, gp_and_tpe
from trialq.driver.sampling.history import BoundedTPE
from trialq.driver.sampling.rule import (
    GP_NEEDS,
    LISTED_POINTS_MAX,
    chosen_sampler,
    too_many_to_list,
)
from trialq.errors import SpecError, StorageUnreachable, UsageError
from trialq.settings import redacted_url
from trialq.spec import CategoricalParam, FloatParam, IntParam, StudySpec, load_spec


def storage_url(spec: StudySpec, override: str | None, from_env: str | None) -> str:
    """`--storage`, else the spec's, else TRIALQ_STORAGE, else SQLite next to the spec."""
    url = override or spec.study.storage or from_env
    if url is None:
        return f"sqlite:///{spec.directory / (spec.study.name + '.db')}"
    return _anchor_sqlite(url, spec.directory)


def remember_storage(spec: StudySpec, override: str) -> None:
    """Note beside the spec the storage a `--storage` run used (its password left out: it
    comes from `.pgpass` or the like), so that `trialq status SPEC` finds the study there."""
    # a read-only folder: `trialq status SPEC --storage URL` still works
    with contextlib.suppress(OSError):
        _remembered_file(spec).write_text(_without_password(override) + "\n", encoding="utf-8")


def remembered_storage(spec: StudySpec) -> str | None:
    """The storage the spec's last `--storage` run used, where noted (`remember_storage`)."""
    try:
        return _remembered_file(spec).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _remembered_file(spec: StudySpec) -> Path:
    return spec.directory / f"{spec.study.name}.storage"


def _without_password(url: str) -> str:
    parsed = sqlalchemy.engine.make_url(url)
    return parsed.set(password=None).render_as_string(hide_password=False)


def _anchor_sqlite(url: str, base: Path) -> str:
    """A relative SQLite path in a spec is taken from the spec's folder, not the cwd."""
    prefix = "sqlite:///"
    if url.startswith(prefix) and not url.startswith(prefix + "/"):
        return prefix + str(base / url.removeprefix(prefix))
    return url


def open_study(spec: StudySpec, url: str, retry_for_s: float = 0.0) -> optuna.Study:
    """Create the study, or load it if it exists (that is how a run resumes).

    The study is the driver's to write, so its trials are read from memory (`mirror`).
    A commit lost with its connection (the server was reached, so no mistake in the URL) is
    tried again for up to `retry_for_s`, as the driver's loop rides out an outage: seen on a
    lossy link between hosts. A retry is safe: an existing study is loaded.
    """
    check_names_fit(spec)
    sampler = make_sampler(spec)
    pruner = make_pruner(spec)
    deadline, wait_s = time.monotonic() + retry_for_s, FIRST_RETRY_S
    while True:
        try:
            with storage_errors(url):
                study = optuna.create_study(
                    storage=mirrored(rdb_storage(url)),
                    study_name=spec.study.name,
                    directions=list(spec.study.objective_directions),
                    sampler=sampler,
                    pruner=pruner,
                    load_if_exists=True,
                )
            held = len(study.get_trials(deepcopy=False))
            if held and "seed" in spec.study.sampler_args:  # resumed: new draws, not replays
                study.sampler = make_sampler(spec, held=held)
            return study
        except optuna.exceptions.StorageInternalError:
            if time.monotonic() + wait_s > deadline:
                raise
            time.sleep(wait_s)
            wait_s = min(wait_s * 2, LONGEST_RETRY_S)


NAME_SHOWN = 60
"""How much of a name too long an error line shows."""


def check_names_fit(spec: StudySpec) -> None:
    """Raise `SpecError` for a name longer than the storage's column holds: the study's or
    a param's (`[space.*]`, `[[enqueue]]`). Metric names are stored inside a value, which
    has no such bound."""
    limits = name_columns()
    names = [("study.name", spec.study.name, "study name")]
    names += [(f"space.{name}", name, "param name") for name in spec.space]
    for index, params in enumerate(spec.enqueue):
        names += [(f"enqueue.{index}.{name}", name, "param name") for name in params]
    for key, name, kind in names:
        if len(name) > limits[kind]:
            shown = key if len(key) <= NAME_SHOWN else key[: NAME_SHOWN - 3] + "..."
            raise SpecError(
                f"{spec.where}: {shown}: a {kind} of {len(name)} characters; the storage "
                f"holds at most {limits[kind]}"
            )


def study_key(study: optuna.Study) -> str:
    """The study's identity on the broker (`TrialRequest.study_key`): its storage's URL (the
    password left out) and its id there, hashed. Two studies of one name in two storages
    differ; a rerun on the same storage URL finds the keys of the trials it re-attaches."""
    backend = rdb_under(study._storage)
    where = repr(study._storage) if backend is None else _without_password(backend.url)
    text = f"{where}#{study._study_id}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def release_connections(study: optuna.Study) -> None:
    """Close the connections the study's database engine keeps in its pool. They would stay
    open until Python's cycle collector finds the engine: a process that runs study after
    study (a notebook calling `trialq.optimize`, a test suite) held two a study and ran
    PostgreSQL out of connections ("too many clients"). The engine opens new ones if the
    study is read again."""
    backend = rdb_under(study._storage)
    if backend is not None:
        backend.engine.dispose()


def find_study(
    target: str, storage: str | None, from_env: str | None, command: str
) -> optuna.Study:
    """The study for `trialq status` and `report`: `target` is a spec file (its study, in the
    storage submit-study chose for it) or a study name (in `--storage`, else TRIALQ_STORAGE)."""
    path = Path(target)
    if path.suffix in (".toml", ".yaml", ".yml") or path.is_file():
        spec = load_spec(path)
        storage = storage or remembered_storage(spec)
        return load_study(spec.study.name, storage_url(spec, storage, from_env), command)
    if (storage or from_env) is None:
        raise UsageError(
            f"{command}: {target!r} is no spec file; for a study name, give --storage "
            "or set TRIALQ_STORAGE"
        )
    return load_study(target, storage or from_env, command)


def load_study(study_name: str, storage: str | None, command: str) -> optuna.Study:
    """The named study, or one line saying why not (no storage given, no such database or
    study, storage unreachable). A missing SQLite file is named, never created."""
    if storage is None:
        raise UsageError(f"{command}: give --storage or set TRIALQ_STORAGE")
    where = redacted_url(storage)
    sqlite_file = storage.removeprefix("sqlite:///") if storage.startswith("sqlite:///") else ""
    if sqlite_file and not Path(sqlite_file).exists():
        raise UsageError(
            f"{command}: no database at {sqlite_file} (looked for study {study_name!r})"
        )
    missing = UsageError(f"{command}: no study named {study_name!r} in {where}")
    if sqlite_file and not _sqlite_holds_study(sqlite_file, study_name):
        raise missing
    try:
        with storage_errors(storage):
            return optuna.load_study(study_name=study_name, storage=rdb_storage(storage))
    except KeyError:
        raise missing from None


def _sqlite_holds_study(path: str, study_name: str) -> bool:
    """Whether the SQLite file holds the study, read without writing: Optuna's storage
    creates what is missing of its schema when opened, and a reader (`trialq status` polled
    as a driver starts) doing so beside the driver creating the file made the driver fail."""
    try:
        uri = f"file:{Path(path).resolve()}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=10)) as db:
            found = db.execute("SELECT 1 FROM studies WHERE study_name = ?", (study_name,))
            return found.fetchone() is not None
    except sqlite3.Error:  # no table of studies yet: a driver is creating the database
        return False


@contextlib.contextmanager
def storage_errors(url: str) -> Iterator[None]:
    """A storage that cannot be opened becomes one `StorageUnreachable` line, password hidden."""
    try:
        yield
    except ImportError as exc:
        raise StorageUnreachable(
            f"storage {redacted_url(url)}: {_missing_driver(url, exc)}"
        ) from None
    except Exception as exc:
        if type(exc).__module__.startswith("sqlalchemy"):
            first = str(exc).splitlines()[0]
            raise StorageUnreachable(f"storage {redacted_url(url)} unreachable: {first}") from None
        raise


def make_sampler(spec: StudySpec, held: int = 0) -> optuna.samplers.BaseSampler:
    """The spec's sampler (`auto`: Optuna's default TPE, `sampling.rule`), built with the
    spec's `sampler_args` and nothing else: `tpe` is the installed Optuna's
    `TPESampler(**sampler_args)` (its history bounded past 500 finished trials,
    `BoundedTPE`). TPE or GP with trials in flight on a declared space never proposes a
    running trial's parameters again (`DistinctFromRunning`); every other draw is the wrapped
    sampler's own. `ask_processes` is for TPE alone: each of its asks is a draw from the
    study as it stands, where the grid, CMA-ES and NSGA-II keep state across asks that copies
    in several processes would repeat, random needs no help, and GP serves short studies the
    driver keeps up with. `held`: the trials the study holds, from which a seeded sampler's
    seed for this run is derived (`run_seed`)."""
    name, args = chosen_sampler(spec), dict(spec.study.sampler_args)
    if spec.study.ask_processes and name != "tpe":
        raise SpecError(
            f"{spec.where}: study.ask_processes: only TPE's asks are spread over processes, "
            f'and this study\'s sampler is {name!r}: set sampler = "tpe" or drop ask_processes'
        )
    modules, fix = _NEEDS.get(name, ((), ""))
    if any(importlib.util.find_spec(module) is None for module in modules):
        # Optuna imports them at the first ask or fit, after the study exists: refuse before.
        raise SpecError(f"{spec.where}: study.sampler: {name!r} needs {fix}")
    _check_listable(spec, name)
    if name == "grid":
        args.setdefault("search_space", _grid_space(spec))
    classes: dict[str, Any] = {
        "tpe": BoundedTPE,
        "gp": OneThreadGP,
        "gp+tpe": gp_and_tpe,
        "random": optuna.samplers.RandomSampler,
        "cmaes": optuna.samplers.CmaEsSampler,
        "nsga2": optuna.samplers.NSGAIISampler,
        "grid": DriverGridSampler,
    }
    try:
        check_sampler_args(classes[name], args, "study.sampler_args")
    except SpecError as exc:
        raise SpecError(f"{spec.path}: {exc}") from None
    seed = args.get("seed")
    if seed is not None and held:
        args["seed"] = run_seed(seed, held)
    sampler: optuna.samplers.BaseSampler = _construct(
        classes[name], args, "study.sampler_args", spec.where
    )
    modelled = name in ("tpe", "gp", "gp+tpe") and spec.study.search_space is None
    if modelled and spec.study.max_in_flight != 1:
        return DistinctFromRunning(sampler, distributions(spec), seed=seed)
    return sampler


def run_seed(seed: int, held: int) -> int:
    """The seed of a run of a seeded study that holds `held` trials: the study's own seed
    for its first run, and one derived from both after, so a resumed study draws new
    parameters (with the study's seed again, a random sampler replayed every trial it had
    run) and a rerun from the same state draws the same."""
    digest = hashlib.sha256(f"{seed}:{held}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1  # below 2**31, as every sampler takes


_GP_FIX = "torch and scipy, which Optuna's GP sampler runs on: pip install torch scipy"


def _check_listable(spec: StudySpec, name: str) -> None:
    """GP and the grid hold every value of a stepped parameter: refuse, before the study
    exists, one with more than they can (it ended the driver at its first ask)."""
    grid_of_space = name == "grid" and "search_space" not in spec.study.sampler_args
    listing = name in ("gp", "gp+tpe") or grid_of_space
    too_many = too_many_to_list(spec) if listing else None
    if too_many is not None:
        raise SpecError(
            f"{spec.where}: space.{too_many}: sampler {name!r} lists every value, and its range "
            f'has over {LISTED_POINTS_MAX:.0e} at its step: use a larger step or sampler = "tpe"'
        )


_NEEDS: dict[str, tuple[tuple[str, ...], str]] = {
    "cmaes": (("cmaes",), "the cmaes package: pip install 'trialq[cmaes]'"),
    "gp": (GP_NEEDS, _GP_FIX),
    "gp+tpe": (GP_NEEDS, _GP_FIX),
}
"""A sampler's modules, looked up before the study exists, and the line that says so."""


class DriverGridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler, minus its `study.stop()` when the grid is used up.

    `stop()` only works inside `optimize()`, which the driver does not use; the driver's
    `n_trials` decides when to stop, and further trials revisit the grid at random.
    """

    def after_trial(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to do: the driver counts trials itself."""


def make_pruner(spec: StudySpec) -> optuna.pruners.BasePruner:
    """The spec's pruner with its arguments (`none` never prunes)."""
    classes: dict[str, Any] = {
        "none": optuna.pruners.NopPruner,
        "median": optuna.pruners.MedianPruner,
        "hyperband": optuna.pruners.HyperbandPruner,
        "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
    }
    pruner_class, args = classes[spec.study.pruner], dict(spec.study.pruner_args)
    key = "study.pruner_args"
    try:
        check_pruner_args(pruner_class, args, key)
    except SpecError as exc:
        raise SpecError(f"{spec.where}: {exc}") from None
    rehearse(_construct(pruner_class, args, key, spec.where), f"{spec.where}: {key}")
    return _construct(pruner_class, args, key, spec.where)  # type: ignore[no-any-return]


def distributions(spec: StudySpec) -> dict[str, optuna.distributions.BaseDistribution]:
    """Optuna distributions for the `[space.*]` tables."""
    result: dict[str, optuna.distributions.BaseDistribution] = {}
    for name, param in spec.space.items():
        if isinstance(param, FloatParam):
            result[name] = optuna.distributions.FloatDistribution(
                param.low, param.high, log=param.log, step=param.step
            )
        elif isinstance(param, IntParam):
            result[name] = optuna.distributions.IntDistribution(
                param.low, param.high, log=param.log, step=param.step
            )
        else:
            result[name] = optuna.distributions.CategoricalDistribution(param.choices)
    return result


def _grid_space(spec: StudySpec) -> dict[str, list[Any]]:
    grid: dict[str, list[Any]] = {}
    for name, param in spec.space.items():
        if isinstance(param, CategoricalParam):
            grid[name] = list(param.choices)
        elif isinstance(param, IntParam) and not param.log:
            grid[name] = list(range(param.low, param.high + 1, param.step))
        else:
            raise SpecError(
                f"{spec.where}: space.{name}: the grid sampler needs int or categorical "
                "params, or study.sampler_args.search_space"
            )
    return grid


def _construct(factory: Any, args: dict[str, Any], key: str, where: str) -> Any:
    """`factory(**args)`, quiet about arguments Optuna calls experimental (`group`,
    `deterministic_objective`): trialq chose them, the user has nothing to act on."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return factory(**args)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"{where}: {key}: {exc}") from None


def _missing_driver(url: str, exc: ImportError) -> str:
    """Which module the URL's database driver needs, and how to get it. Optuna's own message
    names neither: the module is in the ImportError it wraps."""
    module = exc.name or getattr(exc.__cause__, "name", None)
    if module is None:
        return f"driver missing: {exc}"
    fix = "pip install 'trialq[postgres]'" if url.startswith("postgresql") else "install it"
    return f"driver missing: Python module {module!r} is not installed ({fix})"
