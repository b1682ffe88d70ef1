"""What `submit-study` does: check the spec, open the study, find (or start) workers, run
the driver, and summarise. Everything that can be refused is refused before a trial is sent.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import optuna
import redis
from pydantic import SecretStr

from trialq._celery.dispatcher import CeleryDispatcher
from trialq.driver.bounded import within
from trialq.driver.drift import check_spec_against_study
from trialq.driver.ledger import budget_for
from trialq.driver.loop import DriverOptions, StudyDriver
from trialq.driver.progress import NoProgress, ProgressSink, RichProgress
from trialq.driver.search_space import DefineSpace, load_search_space
from trialq.driver.study import open_study, release_connections, remember_storage, storage_url
from trialq.driver.study_lock import holding_study, holding_study_file
from trialq.errors import SpecError, TrialqError, UsageError
from trialq.local import LocalCluster
from trialq.settings import Settings, redacted_url
from trialq.spec import StudySpec, load_spec
from trialq.tracking import StudyInfo, Tracker, Tracking, trackers_for
from trialq.views.summary import study_summary
from trialq.wire import frameworks, heartbeat, routing
from trialq.wire.eviction import eviction_warning
from trialq.wire.messages import BROKER_ATTR

VISIBILITY_MARGIN_S = 300
"""How much longer than a trial's hard limit the broker must wait before redelivering."""


def submit_study(
    spec_path: Path,
    settings: Settings,
    storage_override: str | None,
    n_trials: int | None,
    local_workers: int | None,
    show_progress: bool,
    outage_limit_s: float | None = None,
    budget_overrides: Mapping[str, Any] | None = None,
    verbose: bool = False,
    local_env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """`submit-study`: the spec file's study run (`run_study`), and its summary."""
    run = run_study(
        load_spec(spec_path), settings, storage_override, n_trials, local_workers,
        show_progress, outage_limit_s, budget_overrides, verbose, local_env,
    )  # fmt: skip
    return run.summary


@dataclass(frozen=True)
class StudyRun:
    """What a run of a study leaves: the study, and the summary `--json` prints."""

    storage_url: str
    study_name: str
    summary: dict[str, Any]

    def load(self) -> optuna.Study:
        """The study, read afresh from its storage (the driver's copy is closed)."""
        return optuna.load_study(study_name=self.study_name, storage=self.storage_url)


def run_study(
    spec: StudySpec,
    settings: Settings,
    storage_override: str | None,
    n_trials: int | None,
    local_workers: int | None,
    show_progress: bool,
    outage_limit_s: float | None = None,
    budget_overrides: Mapping[str, Any] | None = None,
    verbose: bool = False,
    local_env: Mapping[str, str] | None = None,
) -> StudyRun:
    """Run the spec's study to its number of finished trials (or until another budget is
    reached: `budget_overrides` set `trialq.driver.budget.Budget` fields for this run):
    what `submit-study` and `trialq.optimize` both do. `local_env`: more of `--local`'s
    workers' environment (its GPU flags)."""
    define_space = _checked_before_the_study(spec, settings, local_workers, budget_overrides)
    trackers = trackers_for(spec.tracking, spec.where)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = storage_url(spec, storage_override, settings.storage)
    target = n_trials or spec.study.n_trials
    outage_limit = outage_limit_s or spec.study.outage_limit_s
    study: optuna.Study | None = None
    try:
        with ExitStack() as stack:
            # Started first: the workers import and beat while the study is opened.
            cluster = _start_local_cluster(
                stack, spec, settings, local_workers, verbose, local_env or {}
            )
            stack.enter_context(holding_study_file(url, spec.study.name))  # SQLite: before opening
            study = open_study(spec, url, retry_for_s=outage_limit)
            if storage_override is not None:  # found there by `trialq status SPEC`
                remember_storage(spec, url)
            study_lock = stack.enter_context(holding_study(study))  # before anything is written
            for note in check_spec_against_study(spec, study):
                _say(f"note: {note}")
            _say(f"study {study.study_name!r} in {redacted_url(url)}")
            if cluster is None and settings.seal is None:
                _say(UNAUTHENTICATED_RESULTS)
            if not _announce_progress(study, target):
                return StudyRun(url, study.study_name, study_summary(study))
            if cluster is not None:
                settings = _use_local_cluster(stack, cluster, spec, settings)
            spec = routed(spec)  # from here, the queue is the trial's GPU class's
            study.set_user_attr(
                BROKER_ATTR, "local" if cluster is not None else redacted_url(settings.broker_url)
            )
            dispatcher = CeleryDispatcher(settings)
            progress: ProgressSink = NoProgress(show_failures=True)
            if show_progress:
                progress = stack.enter_context(RichProgress(spec.study.name, target))
            workers = (
                _local_slots(cluster) if cluster is not None else _live_workers(dispatcher, spec)
            )
            options = DriverOptions(
                max_in_flight=spec.study.max_in_flight or max(1, workers),
                outage_limit_s=outage_limit,
            )
            budget = replace(budget_for(spec, target), **(budget_overrides or {}))
            tracking = _start_tracking(stack, trackers, spec, settings, local_workers is not None)
            driver = StudyDriver(
                spec, study, dispatcher, progress, options, study_lock, define_space, budget=budget,
                tracking=tracking,
            )  # fmt: skip
            ended: TrialqError | None = None
            try:
                driver.run(target)
            except TrialqError as exc:
                ended = exc
        if ended is not None:
            ended.summary = _summary_at_an_end(study, driver)
            raise ended
        if driver.stop is not None:
            _say(driver.stop.line)
        return StudyRun(url, study.study_name, _run_summary(study, driver))
    finally:
        if study is not None:  # the run is over: its pool's connections are closed
            release_connections(study)


def _run_summary(study: optuna.Study, driver: StudyDriver) -> dict[str, Any]:
    """The study's summary with what ended this run (`stopped_by`), its budgets, and the
    trials a failing stop left in flight for the next run."""
    ended = driver.ledger.last_run(driver.ended_by)
    return {**study_summary(study), **ended, "left_in_flight": driver.left_in_flight}


SUMMARY_AT_AN_END_S = 2.0
"""How long a run an error ended waits for its summary: the error may be the storage's own
(a database that hangs), and Ctrl-C must end the driver at once, not after its timeouts."""


def _summary_at_an_end(study: optuna.Study, driver: StudyDriver) -> dict[str, Any] | None:
    """The summary of a run an error ended (exit 5, 130, 2...), read from the driver's
    mirror of the study; None where even that cannot be read within `SUMMARY_AT_AN_END_S`."""
    try:  # the error that ended the run is what the user must see
        return within(SUMMARY_AT_AN_END_S, partial(_run_summary, study, driver), "trialq-summary")
    except Exception:
        return None


def _start_tracking(
    stack: ExitStack, trackers: list[Tracker], spec: StudySpec, settings: Settings, local: bool
) -> Tracking:
    """The spec's trackers (`[tracking]`), started, and closed when `stack` closes."""
    tracking = Tracking(trackers)
    if trackers:
        tracking.start(study_info(spec, _artifact_folder(spec, settings, local)))
        stack.callback(tracking.close)
    return tracking


def study_info(spec: StudySpec, artifact_folder: Path | None) -> StudyInfo:
    """What the trackers know of the study: names of its objectives, and its folders."""
    directions = spec.study.objective_directions
    default = (
        ("value",) if len(directions) == 1 else tuple(f"values_{i}" for i in range(len(directions)))
    )
    return StudyInfo(
        name=spec.study.name,
        directions=directions,
        metric_names=spec.study.objective_metrics or default,
        spec_folder=spec.directory,
        artifact_root=artifact_folder,
    )


def _artifact_folder(spec: StudySpec, settings: Settings, local: bool) -> Path | None:
    """The study's artifact root where it is a folder here: `--local`'s beside the spec, or
    `TRIALQ_ARTIFACT_ROOT`'s (never a bucket)."""
    if local:
        return Path(local_folders(spec, settings)["TRIALQ_ARTIFACT_ROOT"])
    root = settings.artifact_root
    return root if isinstance(root, Path) else None


def _checked_before_the_study(
    spec: StudySpec,
    settings: Settings,
    local_workers: int | None,
    budget_overrides: Mapping[str, Any] | None,
) -> DefineSpace | None:
    """Everything refused before the study is created or opened; the spec's define-by-run
    space, whose module this imports (once, before the study)."""
    if (budget_overrides or {}).get("goal") is not None and len(
        spec.study.objective_directions
    ) > 1:
        raise UsageError(
            "submit-study: --goal: a study with several objectives has no one best value"
        )
    define_space = load_search_space(spec)
    _check_time_limits(spec, settings)
    if local_workers is None:
        CeleryDispatcher(settings).check_reachable()
        warning = eviction_warning(redis.Redis.from_url(settings.broker_url, socket_timeout=5))
        if warning is not None:
            _say(warning)
        check_a_worker_fits(spec, settings.broker_url)
    return define_space


UNAUTHENTICATED_RESULTS = (
    "warning: no result secret (TRIALQ_RESULT_SECRET_FILE): tasks and results are not "
    "authenticated, and anyone who can write to the broker can choose what a trial runs and "
    "tell its result (docs/deployment.md#security)"
)
"""Said once at the start of a run without a secret (`--local` makes its own)."""


def _start_local_cluster(
    stack: ExitStack,
    spec: StudySpec,
    settings: Settings,
    local_workers: int | None,
    verbose: bool,
    local_env: Mapping[str, str],
) -> LocalCluster | None:
    """`--local`'s embedded Redis and workers, stopped when `stack` closes; None without it."""
    if local_workers is None:
        return None
    cluster = LocalCluster(
        local_workers,
        spec.trial.queue,
        local_allow_list(spec),
        extra_env={**local_folders(spec, settings), **local_preload(spec), **local_env},
        log_dir=local_logs(spec),
        log_level="DEBUG" if verbose else "INFO",
    )
    stack.callback(cluster.stop)
    cluster.start()
    return cluster


def _use_local_cluster(
    stack: ExitStack, cluster: LocalCluster, spec: StudySpec, settings: Settings
) -> Settings:
    """The settings that reach `cluster`'s Redis, once its first worker beats: trials wait in
    the queue for the others."""
    cluster.wait_for_workers(1)
    stack.callback(_say, f"workers' logs: {cluster.log_dir}")
    check_a_worker_fits(spec, cluster.broker_url)
    return settings.model_copy(
        update={
            "broker_url": cluster.broker_url,
            "result_backend": cluster.broker_url,
            "result_secret": SecretStr(cluster.result_secret),
        }
    )


def _local_slots(cluster: LocalCluster) -> int:
    """Trials `--local`'s workers run at once: one each, or a GPU worker's slots."""
    client = redis.Redis.from_url(cluster.broker_url, socket_timeout=10)
    beats = heartbeat.live_workers(client)
    return max(cluster.workers, sum(b.gpus.slots if b.gpus else 1 for b in beats))


def _live_workers(dispatcher: CeleryDispatcher, spec: StudySpec) -> int:
    """The live workers on the trial's queue, warning when there are none yet."""
    workers = dispatcher.live_worker_count(spec.trial.queue)
    if workers == 0:
        print(
            f"warning: no live worker consumes queue {spec.trial.queue!r} yet; "
            "trials wait in the queue until one starts",
            file=sys.stderr,
        )
    return workers


def routed(spec: StudySpec) -> StudySpec:
    """The spec with its queue the one its trials go to: `[trial] queue`, or its class
    queue where `[trial] gpus` or `gpu_memory_mb` say what a trial needs (wire/routing.py)."""
    trial = spec.trial
    queue = routing.trial_queue(trial.queue, trial.gpus, trial.gpu_memory_mb)
    return spec.model_copy(update={"trial": trial.model_copy(update={"queue": queue})})


def check_a_worker_fits(spec: StudySpec, broker_url: str) -> None:
    """Refuse, exit 2, a study whose trials no live worker on its queue can fit; with no
    worker on the queue yet (scaled from zero, not started), the trials wait for one."""
    trial = spec.trial
    needed = routing.trial_queue(trial.queue, trial.gpus, trial.gpu_memory_mb)
    client = redis.Redis.from_url(broker_url, socket_timeout=10)
    workers = [w for w in heartbeat.live_workers(client) if _consumes(w, trial.queue)]
    if not workers or any(needed in worker.queues for worker in workers):
        return
    slots = "; ".join(
        f"{w.name}: {w.gpus.describe() if w.gpus else 'no GPU slots'}" for w in workers
    )
    raise UsageError(
        f"submit-study: no live worker on queue {trial.queue!r} can fit a trial of "
        f"{routing.need_text(trial.gpus, trial.gpu_memory_mb)} ([trial] gpus, gpu_memory_mb); "
        f"workers: {slots}"
    )


def _consumes(worker: heartbeat.WorkerBeat, queue: str) -> bool:
    return any(routing.base_queue(consumed) == queue for consumed in worker.queues)


def _announce_progress(study: optuna.Study, target: int) -> bool:
    """Say where a resumed study stands; False when it has nothing left to do (then no
    worker or local Redis is started)."""
    trials = study.get_trials(deepcopy=False)
    done = sum(t.state.is_finished() for t in trials)
    unfinished = len(trials) - done
    if done >= target and unfinished == 0:
        _say(f"already complete ({done}/{target} trials finished)")
        return False
    if trials:
        _say(f"resuming: {done} done, {unfinished} unfinished, {max(0, target - done)} to go")
    return True


def _say(line: str) -> None:
    print(line, file=sys.stderr)


LOCAL_RUNS_KEPT = 5
"""`--local` runs whose logs are kept beside the spec; older ones are removed."""


def local_logs(spec: StudySpec, now: datetime | None = None) -> Path:
    """A folder of this `--local` run's logs under `<study>-logs/` beside the spec, named by
    its start time; the newest `LOCAL_RUNS_KEPT` runs are kept, so a failed run's logs
    survive the next."""
    root = spec.directory / f"{spec.study.name}-logs"
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S-%f")
    earlier = sorted(p for p in root.glob("*-*-*") if p.is_dir()) if root.is_dir() else []
    for old in earlier[: max(0, len(earlier) - (LOCAL_RUNS_KEPT - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return root / stamp


def search_paths_for(spec: StudySpec) -> tuple[str, ...]:
    """Folders a local worker imports entrypoints from (its own `TRIALQ_IMPORT_PATHS`, never
    a message's): the spec's, the current directory, and the one this process found the
    entrypoint's module in (a notebook's `sys.path` entry is not the workers')."""
    found = spec.trial.entrypoint.module_folder(spec.directory)
    folders = (str(spec.directory), str(Path.cwd()), *([str(found)] if found else []))
    return tuple(dict.fromkeys(folders))


def local_folders(spec: StudySpec, settings: Settings) -> dict[str, str]:
    """`--local`'s checkpoint and artifact roots, beside the spec (as its logs are) unless
    the environment names them: kept across runs, so a rerun resumes what was preempted;
    and its workers' import paths, the spec's folder and this one (never a message's)."""
    checkpoints = settings.checkpoint_root or spec.directory / f"{spec.study.name}-checkpoints"
    artifacts = settings.artifact_root or spec.directory / f"{spec.study.name}-artifacts"
    return {
        "TRIALQ_CHECKPOINT_ROOT": (
            checkpoints if isinstance(checkpoints, str) else str(checkpoints.resolve())
        ),
        "TRIALQ_ARTIFACT_ROOT": (
            artifacts if isinstance(artifacts, str) else str(artifacts.resolve())
        ),
        "TRIALQ_IMPORT_PATHS": os.pathsep.join(search_paths_for(spec)),
    }


def local_preload(spec: StudySpec) -> dict[str, str]:
    """`--local`'s workers preload the spec's framework (`[trial] framework`, or the one its
    entrypoint function uses) and what the entrypoint's module imports at its top
    (`TRIALQ_PRELOAD_FROM`), unless `TRIALQ_PRELOAD` says otherwise: a PyTorch study never
    gets TensorFlow because TensorFlow is installed (docs/frameworks.md, "Preloading"). A
    framework not installed here is never preloaded: one warning line, and the study runs."""
    if "TRIALQ_PRELOAD" in os.environ:
        return {}
    entrypoint = spec.trial.entrypoint
    target = (
        str((spec.directory / entrypoint.target).resolve())
        if entrypoint.is_file
        else (entrypoint.target)
    )
    chosen = {"TRIALQ_PRELOAD": "none", "TRIALQ_PRELOAD_FROM": target}
    framework = _study_framework(spec)
    if framework is None:
        return chosen
    if importlib.util.find_spec(framework) is None:
        _say(f"warning: {framework} is not installed here: --local preloads nothing for it")
        return chosen
    return {**chosen, "TRIALQ_PRELOAD": ",".join(frameworks.PRELOAD[framework])}


def _study_framework(spec: StudySpec) -> str | None:
    """`[trial] framework`, or for `auto` the one the entrypoint function uses."""
    if spec.trial.framework != frameworks.AUTO:
        return spec.trial.framework
    entrypoint = spec.trial.entrypoint
    source = entrypoint.source(spec.directory)
    keras_backend = os.environ.get("KERAS_BACKEND")
    return frameworks.framework_in_source(source, keras_backend, entrypoint.function)


def local_allow_list(spec: StudySpec) -> tuple[str, ...]:
    """In --local, workers may import what the spec itself names, and nothing else."""
    allowed = [_allow_entry(spec, spec.trial.entrypoint.target)]
    if spec.study.search_space is not None:
        allowed.append(_allow_entry(spec, spec.study.search_space.target))
    return tuple(allowed)


def _allow_entry(spec: StudySpec, target: str) -> str:
    if target.endswith(".py") or "/" in target:
        return str((spec.directory / target).resolve().parent) + "/"
    return target.split(".")[0]


def _check_time_limits(spec: StudySpec, settings: Settings) -> None:
    """Redis would run a trial twice if it outlived the broker's visibility timeout."""
    needed = spec.trial.hard_limit_s + VISIBILITY_MARGIN_S
    if needed > settings.visibility_timeout_s:
        raise SpecError(
            f"{spec.where}: trial.timeout_s: {spec.trial.timeout_s:g} s plus grace needs "
            f"TRIALQ_VISIBILITY_TIMEOUT_S >= {needed:g} (it is {settings.visibility_timeout_s})"
        )
