"""What `submit-study` does: check the spec, open the study, find (or start) workers, run
the driver, and summarise. Everything that can be refused is refused before a trial is sent.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import optuna
import redis

from trialq import local
from trialq._celery.dispatcher import CeleryDispatcher
from trialq.driver._storage.store import TrialStore, store_for
from trialq.driver.bounded import within
from trialq.driver.budget import Budget
from trialq.driver.drift import check_spec_against_study
from trialq.driver.ledger import LastRun, budget_for
from trialq.driver.loop import DriverOptions, StudyDriver
from trialq.driver.progress import NoProgress, ProgressSink, RichProgress
from trialq.driver.search_space import DefineSpace, load_search_space
from trialq.driver.study import open_study, release_connections, remember_storage, storage_url
from trialq.driver.study_lock import StudyLock, holding_study, holding_study_file
from trialq.errors import SpecError, TrialqError, UsageError
from trialq.local import LocalCluster, LocalGpus, local_folders
from trialq.settings import Settings, redacted_url
from trialq.spec import StudySpec, load_spec
from trialq.tracking import StudyInfo, Tracker, Tracking, trackers_for
from trialq.views.summary import StudySummary, study_summary
from trialq.wire import heartbeat, routing
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
    local_gpus: LocalGpus | None = None,
) -> dict[str, Any]:
    """`submit-study`: the spec file's study run (`run_study`), and its summary's JSON."""
    options = RunOptions(
        storage_override=storage_override,
        n_trials=n_trials,
        local_workers=local_workers,
        show_progress=show_progress,
        outage_limit_s=outage_limit_s,
        budget_overrides=dict(budget_overrides or {}),
        verbose=verbose,
        local_gpus=local_gpus,
    )
    return run_study(load_spec(spec_path), settings, options).summary.to_json()


@dataclass(frozen=True)
class RunOptions:
    """How one run of a study goes, beyond its spec and settings: what `submit-study`'s
    flags and `trialq.optimize`'s arguments say, handed whole to `run_study`."""

    storage_override: str | None = None
    """The study's storage, over the spec's and `TRIALQ_STORAGE` (remembered for status)."""
    n_trials: int | None = None
    """Finished trials to reach, over the spec's `[study] n_trials`."""
    local_workers: int | None = None
    """`--local`'s workers to start; None: a broker's workers run the trials."""
    show_progress: bool = True
    outage_limit_s: float | None = None
    """Over the spec's `[study] outage_limit_s`."""
    budget_overrides: Mapping[str, Any] = field(default_factory=dict)
    """`trialq.driver.budget.Budget` fields set for this run (`--max-wall-s`...)."""
    verbose: bool = False
    local_gpus: LocalGpus | None = None
    """The GPUs `--local`'s one worker owns (its GPU flags)."""

    def budget(self, spec: StudySpec) -> Budget:
        """The run's budget, its one source of `n_trials`: the spec's, as these options set
        it."""
        n_trials = self.n_trials or spec.study.n_trials
        return replace(budget_for(spec, n_trials), **self.budget_overrides)


@dataclass(frozen=True)
class RunSummary:
    """What a run of a study did: the study as it stands, how the run ended (None where the
    study had nothing left to do, and no run started), and the trials a failing stop left
    in flight for the next run."""

    study: StudySummary
    last_run: LastRun | None = None
    left_in_flight: int = 0

    def to_json(self) -> dict[str, Any]:
        """As `submit-study --json` prints it: the study's summary, and for a run, its
        `stopped_by`, `budgets` and `left_in_flight`."""
        summary = self.study.to_json()
        if self.last_run is None:
            return summary
        return {**summary, **self.last_run.to_json(), "left_in_flight": self.left_in_flight}


@dataclass(frozen=True)
class StudyRun:
    """What a run of a study leaves: the study, and the summary `--json` prints."""

    storage_url: str
    study_name: str
    summary: RunSummary

    def load(self) -> optuna.Study:
        """The study, read afresh from its storage (the driver's copy is closed)."""
        return optuna.load_study(study_name=self.study_name, storage=self.storage_url)


def run_study(spec: StudySpec, settings: Settings, options: RunOptions | None = None) -> StudyRun:
    """Run the spec's study to its number of finished trials (or until another budget is
    reached): what `submit-study` and `trialq.optimize` both do."""
    options = options or RunOptions()
    define_space = _checked_before_the_study(spec, settings, options)
    trackers = trackers_for(spec.tracking, spec.where)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = storage_url(spec, options.storage_override, settings.storage)
    study: optuna.Study | None = None
    try:
        with ExitStack() as stack:
            # Started first: the workers import and beat while the study is opened.
            cluster = _start_local_cluster(stack, spec, settings, options)
            stack.enter_context(holding_study_file(url, spec.study.name))  # SQLite: before opening
            study = open_study(spec, url, retry_for_s=_outage_limit(spec, options))
            study_lock = stack.enter_context(holding_study(study))  # before anything is written
            store = store_for(study)
            _opened(spec, study, store, url, options, cluster is None and settings.seal is None)
            budget = options.budget(spec)
            if not _announce_progress(study, budget.n_trials):
                return StudyRun(url, study.study_name, RunSummary(study_summary(study)))
            if cluster is not None:
                settings = _use_local_cluster(stack, cluster, spec, settings)
            driver = _driver(stack, spec, store, settings, cluster, options, budget, trackers,
                             study_lock, define_space)  # fmt: skip
            ended = _driven(driver)
        if ended is not None:
            ended.summary = _summary_at_an_end(study, driver)
            raise ended
        if driver.stop is not None:
            _say(driver.stop.line)
        return StudyRun(url, study.study_name, _run_summary(study, driver))
    finally:
        if study is not None:  # the run is over: its pool's connections are closed
            release_connections(study)


def _outage_limit(spec: StudySpec, options: RunOptions) -> float:
    return options.outage_limit_s or spec.study.outage_limit_s


def _opened(
    spec: StudySpec,
    study: optuna.Study,
    store: TrialStore,
    url: str,
    options: RunOptions,
    unsealed: bool,
) -> None:
    """What is said and remembered once the study is open and held."""
    if options.storage_override is not None:  # found there by `trialq status SPEC`
        remember_storage(spec, url)
    for note in check_spec_against_study(spec, study, store):
        _say(f"note: {note}")
    _say(f"study {study.study_name!r} in {redacted_url(url)}")
    if unsealed:
        _say(UNAUTHENTICATED_RESULTS)


def _driver(
    stack: ExitStack,
    spec: StudySpec,
    store: TrialStore,
    settings: Settings,
    cluster: LocalCluster | None,
    options: RunOptions,
    budget: Budget,
    trackers: list[Tracker],
    study_lock: StudyLock | None,
    define_space: DefineSpace | None,
) -> StudyDriver:
    """The run's driver, its dispatcher, progress and trackers started on `stack`."""
    spec = routed(spec)  # from here, the queue is the trial's GPU class's
    store.set_study_attr(
        BROKER_ATTR, "local" if cluster is not None else redacted_url(settings.broker_url)
    )
    dispatcher = CeleryDispatcher(settings)
    progress: ProgressSink = NoProgress(show_failures=True)
    if options.show_progress:
        progress = stack.enter_context(RichProgress(spec.study.name, budget.n_trials))
    workers = local.running_slots(cluster) if cluster else _live_workers(dispatcher, spec)
    driver_options = DriverOptions(
        max_in_flight=spec.study.max_in_flight or max(1, workers),
        outage_limit_s=_outage_limit(spec, options),
    )
    tracking = _start_tracking(stack, trackers, spec, settings, cluster is not None)
    return StudyDriver(spec, store.study, dispatcher, progress, driver_options, study_lock,
                       define_space, budget=budget, store=store, tracking=tracking)  # fmt: skip


def _driven(driver: StudyDriver) -> TrialqError | None:
    """Run `driver` to its end; the error that ended it, kept for after the stack closes."""
    try:
        driver.run()
    except TrialqError as exc:
        return exc
    return None


def _run_summary(study: optuna.Study, driver: StudyDriver) -> RunSummary:
    """The study's summary with what ended this run (`stopped_by`), its budgets, and the
    trials a failing stop left in flight for the next run."""
    ended = driver.ledger.last_run(driver.ended_by)
    return RunSummary(study_summary(study), ended, driver.left_in_flight)


def _summary_json(study: optuna.Study, driver: StudyDriver) -> dict[str, Any]:
    return _run_summary(study, driver).to_json()


SUMMARY_AT_AN_END_S = 2.0
"""How long a run an error ended waits for its summary: the error may be the storage's own
(a database that hangs), and Ctrl-C must end the driver at once, not after its timeouts."""


def _summary_at_an_end(study: optuna.Study, driver: StudyDriver) -> dict[str, Any] | None:
    """The summary of a run an error ended (exit 5, 130, 2...), read from the driver's
    mirror of the study; None where even that cannot be read within `SUMMARY_AT_AN_END_S`."""
    try:  # the error that ended the run is what the user must see
        summarised = partial(_summary_json, study, driver)
        return within(SUMMARY_AT_AN_END_S, summarised, "trialq-summary")
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
        return Path(local_folders(spec, settings).artifacts)
    root = settings.artifact_root
    return root if isinstance(root, Path) else None


def _checked_before_the_study(
    spec: StudySpec, settings: Settings, options: RunOptions
) -> DefineSpace | None:
    """Everything refused before the study is created or opened; the spec's define-by-run
    space, whose module this imports (once, before the study)."""
    if (
        options.budget_overrides.get("goal") is not None
        and len(spec.study.objective_directions) > 1
    ):
        raise UsageError(
            "submit-study: --goal: a study with several objectives has no one best value"
        )
    define_space = load_search_space(spec)
    _check_time_limits(spec, settings)
    if options.local_workers is None:
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
    stack: ExitStack, spec: StudySpec, settings: Settings, options: RunOptions
) -> LocalCluster | None:
    """`--local`'s embedded Redis and workers, stopped when `stack` closes; None without it."""
    if options.local_workers is None:
        return None
    cluster = local.study_cluster(
        spec, settings, options.local_workers, options.verbose, options.local_gpus
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
    return local.reaching(cluster, settings)


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


def _check_time_limits(spec: StudySpec, settings: Settings) -> None:
    """Redis would run a trial twice if it outlived the broker's visibility timeout."""
    needed = spec.trial.hard_limit_s + VISIBILITY_MARGIN_S
    if needed > settings.visibility_timeout_s:
        raise SpecError(
            f"{spec.where}: trial.timeout_s: {spec.trial.timeout_s:g} s plus grace needs "
            f"TRIALQ_VISIBILITY_TIMEOUT_S >= {needed:g} (it is {settings.visibility_timeout_s})"
        )
