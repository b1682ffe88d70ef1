"""What the driver itself costs a trial: Optuna's ask and tell and the user attrs it writes.

    python -m benchmarks.driver [--quick] [--trials N] [--workers N] [--storage URL]

Runs N no-op trials (default 1,000) through `--local`-style workers (default 8, nothing
preloaded: the trials import nothing) with the real `StudyDriver` and TPE over a three-param
space, on PostgreSQL by default. Times, with `time.perf_counter` around the calls (here, not in
trialq), every `study.ask`, `study.tell`, user-attr write and `flush_behind` the driver makes, the
storage reads its progress line makes, and inside `ask` the sampler's own work (its
`infer_relative_search_space`, `sample_relative` and `sample_independent`), wall clock and
the driver thread's CPU. Prints the per-trial cost, how it grows with the
number of finished trials (TPE's ask reads and fits every trial so far), and the throughput
ceiling the driver alone sets; writes JSON under benchmarks/results/. The study is deleted
afterwards (`--keep` keeps it).

Two runs, same trials, same driver: `trialq` (the study in trialq's `MirroredStorage`, as
submit-study opens it) and the baseline `optuna` (Optuna's own storage layer, one
`set_user_attr` a key: the same loop written with plain Optuna calls). A third, `sampler`,
is the floor any driver pays: the same asks and tells, as many in flight, on Optuna's
in-memory storage in this process (no database, no workers, no attrs), so what is left of
trialq's cost above it is the driver's own.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import textwrap
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import optuna

import trialq.driver._storage.mirror
import trialq.driver._storage.store
import trialq.driver.loop
from benchmarks.overhead import RESULTS, ROOT, environment, tree_path
from trialq._celery.dispatcher import CeleryDispatcher
from trialq.driver.ledger import budget_for
from trialq.driver.loop import DriverOptions, StudyDriver
from trialq.driver.progress import NoProgress
from trialq.driver.study import distributions, make_pruner, make_sampler, open_study
from trialq.local import LocalCluster
from trialq.settings import Settings
from trialq.spec import StudySpec, load_spec

DEFAULT_STORAGE = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
BUCKET = 100


class Timings:
    """Seconds spent in each instrumented call, by trial number where there is one: wall
    clock, and the driver thread's own CPU (the rest is waiting: on PostgreSQL, on Redis, or
    for a core the workers hold)."""

    def __init__(self) -> None:
        self.by_trial: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        self.calls: dict[str, int] = defaultdict(int)
        self.totals: dict[str, float] = defaultdict(float)
        self.cpu_totals: dict[str, float] = defaultdict(float)

    def add(self, kind: str, seconds: float, number: int | None = None, cpu_s: float = 0.0) -> None:
        self.calls[kind] += 1
        self.totals[kind] += seconds
        self.cpu_totals[kind] += cpu_s
        if number is not None:
            self.by_trial[kind][number] += seconds

    @contextmanager
    def measure(self, kind: str, number: int | None = None) -> Iterator[None]:
        """Time the block, wall clock and CPU, as one call of `kind`."""
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.add(kind, time.perf_counter() - wall, number, time.thread_time() - cpu)


@contextmanager
def instrumented(study: optuna.Study, timings: Timings, attrs_one_by_one: bool) -> Iterator[None]:
    """Time the driver's storage calls without touching trialq's code.

    With `attrs_one_by_one`, the driver's batched user-attr write is swapped for one
    `Trial.set_user_attr` a key (what plain Optuna does), to compare in the same run.
    """
    ask, tell = study.ask, study.tell
    set_user_attr = optuna.Trial.set_user_attr
    best_value = optuna.Study.best_value
    store = trialq.driver._storage.store.MirroredTrialStore
    batched, flush_behind = store.set_attrs, store.flush_behind
    commit = trialq.driver._storage.mirror.MirroredStorage._commit

    def timed_ask(*args: Any, **kwargs: Any) -> optuna.Trial:
        wall, cpu = time.perf_counter(), time.thread_time()
        trial = ask(*args, **kwargs)  # the trial's number is known only afterwards
        timings.add("ask", time.perf_counter() - wall, trial.number, time.thread_time() - cpu)
        return trial

    def timed_tell(trial: optuna.Trial, *args: Any, **kwargs: Any) -> Any:
        with timings.measure("tell", trial.number):
            return tell(trial, *args, **kwargs)

    def timed_set_user_attrs(self: Any, trial: optuna.Trial, attrs: dict[str, Any]) -> None:
        with timings.measure("user_attrs", trial.number):
            if attrs_one_by_one:
                for key, value in attrs.items():
                    set_user_attr(trial, key, value)
            else:
                batched(self, trial, attrs)

    def timed_flush(self: Any) -> Any:
        # A trial's record before it is sent, and a step's leftover writes (tells with no send
        # after them); the commit itself runs in the writer thread (background_commit).
        with timings.measure("flush"):
            return flush_behind(self)

    def timed_commit(storage: Any, batches: Any) -> None:
        with timings.measure("background_commit"):  # in the writer thread: its own CPU
            commit(storage, batches)

    def timed_best_value(self: optuna.Study) -> float:
        with timings.measure("progress_best_value"):
            return float(best_value.fget(self))

    sampler = study.sampler
    sampler_methods = {
        name: getattr(sampler, name)
        for name in ("infer_relative_search_space", "sample_relative", "sample_independent")
    }

    def timed_sampler_method(name: str) -> Callable[..., Any]:
        method = sampler_methods[name]

        def timed(study: optuna.Study, trial: optuna.trial.FrozenTrial, *args: Any) -> Any:
            with timings.measure("sampler", trial.number):
                return method(study, trial, *args)

        return timed

    with ExitStack() as stack:

        def swap(owner: Any, name: str, replacement: Any) -> None:
            stack.enter_context(mock.patch.object(owner, name, replacement))

        for name in sampler_methods:
            swap(sampler, name, timed_sampler_method(name))
        swap(study, "ask", timed_ask)
        swap(study, "tell", timed_tell)
        swap(optuna.Study, "best_value", property(timed_best_value))
        swap(store, "set_attrs", timed_set_user_attrs)
        swap(store, "flush_behind", timed_flush)
        swap(trialq.driver._storage.mirror.MirroredStorage, "_commit", timed_commit)
        yield


def timed_dispatcher(dispatcher: CeleryDispatcher, timings: Timings) -> None:
    """Time the driver's Redis calls too (sending trials, reading their states)."""
    for name in ("submit", "statuses", "pending_ids"):
        method: Callable[..., Any] = getattr(dispatcher, name)

        def timed(
            *args: Any, _method: Callable[..., Any] = method, _name: str = name, **kwargs: Any
        ) -> Any:
            with timings.measure(f"redis_{_name}"):
                return _method(*args, **kwargs)

        setattr(dispatcher, name, timed)


def write_spec(
    folder: Path, name: str, n_trials: int, workers: int, sampler: str, timeout_s: int = 60
) -> Path:
    """A study of no-op trials over three parameters: what the driver benchmarks run."""
    path = folder / "driver-bench.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            [study]
            name = "{name}"
            direction = "maximize"
            n_trials = {n_trials}
            max_in_flight = {workers}
            sampler = "{sampler}"
            sampler_args = {{ seed = 0 }}
            pruner = "none"
            [trial]
            entrypoint = "benchmarks.trials:noop"
            timeout_s = {timeout_s}
            [space.x]
            type = "float"
            low = -1.0
            high = 1.0
            [space.units]
            type = "int"
            low = 4
            high = 32
            [space.learning_rate]
            type = "float"
            low = 1e-4
            high = 1e-1
            log = true
            """
        )
    )
    return path


def summarise(
    timings: Timings, n_trials: int, wall_s: float, process_cpu_s: float
) -> dict[str, Any]:
    """Per-trial driver cost (mean, p50, p95), its growth by bucket of trials, and the ceiling."""
    kinds = ("ask", "tell", "user_attrs")
    unnumbered = ("flush",)  # handing writes to the writer thread: no one trial's alone
    per_trial = {
        number: sum(timings.by_trial[kind].get(number, 0.0) for kind in kinds)
        for number in range(n_trials)
    }
    costs = sorted(per_trial.values())
    unnumbered_s = sum(timings.totals[kind] for kind in unnumbered)
    unnumbered_cpu_s = sum(timings.cpu_totals[kind] for kind in unnumbered)
    buckets = []
    for start in range(0, n_trials, BUCKET):
        numbers = range(start, min(start + BUCKET, n_trials))
        row: dict[str, Any] = {"trials": f"{start}-{numbers[-1]}"}
        for kind in (*kinds, "sampler"):
            row[f"{kind}_ms"] = round(
                1e3 * statistics.mean(timings.by_trial[kind].get(n, 0.0) for n in numbers), 2
            )
        row["total_ms"] = round(1e3 * statistics.mean(per_trial[n] for n in numbers), 2)
        buckets.append(row)
    # The sampler's time is within ask's; the commits run in the writer thread, beside the loop.
    driver_s = sum(
        t for kind, t in timings.totals.items() if kind not in ("sampler", "background_commit")
    )
    # The loop's other work a trial (sending it, polling, the progress line, leftover writes)
    # counts against the ceiling too, at its mean over the run.
    rest_s = (driver_s - sum(timings.totals[kind] for kind in kinds)) / n_trials
    last = buckets[-1]["total_ms"] / 1e3 + rest_s
    return {
        "trials": n_trials,
        "wall_s": round(wall_s, 2),
        "trials_per_s": round(n_trials / wall_s, 1),
        "driver_per_trial_ms": {
            "mean": round(1e3 * (sum(costs) + unnumbered_s) / n_trials, 2),
            "p50": round(1e3 * costs[len(costs) // 2], 2),
            "p95": round(1e3 * costs[int(len(costs) * 0.95)], 2),
        },
        "driver_cpu_per_trial_ms": round(
            1e3 * (sum(timings.cpu_totals[kind] for kind in kinds) + unnumbered_cpu_s) / n_trials,
            2,
        ),
        "process_cpu_per_trial_ms": round(1e3 * process_cpu_s / n_trials, 2),
        "background_commit_per_trial_ms": round(
            1e3 * timings.totals["background_commit"] / n_trials, 2
        ),
        "background_commit_cpu_per_trial_ms": round(
            1e3 * timings.cpu_totals["background_commit"] / n_trials, 2
        ),
        "sampler_per_trial_ms": round(1e3 * timings.totals["sampler"] / n_trials, 2),
        "without_sampler_per_trial_ms": round(
            1e3 * (sum(costs) + unnumbered_s - timings.totals["sampler"]) / n_trials, 2
        ),
        "without_sampler_cpu_per_trial_ms": round(
            1e3
            * (
                sum(timings.cpu_totals[k] for k in kinds)
                + unnumbered_cpu_s
                - timings.cpu_totals["sampler"]
            )
            / n_trials,
            2,
        ),
        "sampler_cpu_per_trial_ms": round(1e3 * timings.cpu_totals["sampler"] / n_trials, 2),
        "cpu_per_trial_ms_by_kind": {
            kind: round(1e3 * timings.cpu_totals[kind] / n_trials, 2)
            for kind in sorted(timings.cpu_totals)
        },
        "per_trial_ms_by_kind": {
            kind: round(1e3 * timings.totals[kind] / n_trials, 2) for kind in sorted(timings.totals)
        },
        "calls_per_trial": {
            kind: round(timings.calls[kind] / n_trials, 2) for kind in sorted(timings.calls)
        },
        "growth_by_bucket": buckets,
        "driver_busy_fraction": round(driver_s / wall_s, 3),
        "loop_rest_per_trial_ms": round(1e3 * rest_s, 2),
        "ceiling_trials_per_s_at_end": round(1 / last, 1) if last > 0 else None,
    }


def print_summary(summary: dict[str, Any]) -> None:
    cost = summary["driver_per_trial_ms"]
    print(
        f"{summary['trials']} trials in {summary['wall_s']} s ({summary['trials_per_s']}/s); "
        f"driver ask + tell + writes per trial: mean {cost['mean']} ms, p50 {cost['p50']} ms, "
        f"p95 {cost['p95']} ms"
    )
    print(
        f"of which the driver's own CPU: {summary['driver_cpu_per_trial_ms']} ms a trial "
        "(the rest is waiting for PostgreSQL, Redis or a core)"
    )
    print(
        f"the driver process's CPU, all threads: {summary['process_cpu_per_trial_ms']} ms a "
        f"trial; commits in the writer thread, beside the loop: "
        f"{summary['background_commit_per_trial_ms']} ms "
        f"({summary['background_commit_cpu_per_trial_ms']} ms CPU)"
    )
    print(
        f"of which the sampler's own work inside ask: {summary['sampler_per_trial_ms']} ms "
        f"({summary['sampler_cpu_per_trial_ms']} ms CPU); the rest: "
        f"{summary['without_sampler_per_trial_ms']} ms "
        f"({summary['without_sampler_cpu_per_trial_ms']} ms CPU)"
    )
    print("per trial, by call (ms):", summary["per_trial_ms_by_kind"])
    print("CPU per trial, by call (ms):", summary["cpu_per_trial_ms_by_kind"])
    print("calls per trial:", summary["calls_per_trial"])
    print(
        f"{'trials':>10} {'ask ms':>8} {'sampler':>8} {'tell ms':>8} {'attrs ms':>9} "
        f"{'total ms':>9}"
    )
    for row in summary["growth_by_bucket"]:
        print(
            f"{row['trials']:>10} {row['ask_ms']:>8} {row['sampler_ms']:>8} {row['tell_ms']:>8} "
            f"{row['user_attrs_ms']:>9} {row['total_ms']:>9}"
        )
    print(
        f"driver busy {100 * summary['driver_busy_fraction']:.0f}% of the run; at the last "
        f"bucket's cost, plus {summary['loop_rest_per_trial_ms']} ms a trial of sending and "
        f"polling, it alone caps the study at {summary['ceiling_trials_per_s_at_end']} trials/s"
    )


def open_plain_study(spec: StudySpec, url: str) -> optuna.Study:
    """The study as plain Optuna opens it: Optuna's own storage layer, nothing mirrored."""
    return optuna.create_study(
        storage=optuna.storages.get_storage(url),
        study_name=spec.study.name,
        directions=list(spec.study.objective_directions),
        sampler=make_sampler(spec),
        pruner=make_pruner(spec),
    )


def run_sampler_alone(args: argparse.Namespace) -> dict[str, Any]:
    """The same study's asks and tells on Optuna's in-memory storage, `args.workers` trials in
    flight, each told the value the no-op trial returns: the sampler's own cost."""
    with tempfile.TemporaryDirectory() as folder:
        spec = load_spec(
            write_spec(Path(folder), "sampler", args.trials, args.workers, args.sampler)
        )
    study = optuna.create_study(
        directions=list(spec.study.objective_directions), sampler=make_sampler(spec)
    )
    space = distributions(spec)
    timings = Timings()
    in_flight: list[optuna.Trial] = []
    with instrumented(study, timings, attrs_one_by_one=False):
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.trials):
            in_flight.append(study.ask(space))
            if len(in_flight) == args.workers:
                oldest = in_flight.pop(0)
                study.tell(oldest, oldest.params["x"])  # what benchmarks.trials:noop returns
        for trial in in_flight:
            study.tell(trial, trial.params["x"])
        wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    summary = summarise(timings, args.trials, wall_s, cpu_s)
    summary.update(variant="sampler", complete=len(study.trials))
    return summary


def run_study(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    """One study of `args.trials` no-op trials; the driver's timings, summarised."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = f"trialq-bench-driver-{stamp}-{variant}"
    with tempfile.TemporaryDirectory() as folder:
        spec = load_spec(write_spec(Path(folder), name, args.trials, args.workers, args.sampler))
    timings = Timings()
    env = {"PYTHONPATH": tree_path(), "TRIALQ_PRELOAD": "none"}
    plain = variant == "optuna"
    study = open_plain_study(spec, args.storage) if plain else open_study(spec, args.storage)
    try:
        with LocalCluster(args.workers, "gpu", ("benchmarks",), extra_env=env) as cluster:
            dispatcher = CeleryDispatcher(Settings(broker_url=cluster.broker_url))
            timed_dispatcher(dispatcher, timings)
            options = DriverOptions(max_in_flight=args.workers)
            budget = budget_for(spec, args.trials)
            driver = StudyDriver(spec, study, dispatcher, NoProgress(), options, budget=budget)
            with instrumented(study, timings, attrs_one_by_one=plain):
                started, cpu = time.perf_counter(), time.process_time()
                driver.run()
                wall_s, cpu_s = time.perf_counter() - started, time.process_time() - cpu
        summary = summarise(timings, args.trials, wall_s, cpu_s)
        states = [t.state.name for t in study.get_trials(deepcopy=False)]
    finally:
        if not args.keep:
            optuna.delete_study(study_name=name, storage=args.storage)
    summary.update(variant=variant, complete=states.count("COMPLETE"))
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.driver", description=__doc__)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--storage", default=DEFAULT_STORAGE, help="Optuna storage URL")
    parser.add_argument("--sampler", default="tpe", choices=["tpe", "random"])
    parser.add_argument("--quick", action="store_true", help="100 trials through 4 workers")
    parser.add_argument(
        "--no-baseline", action="store_true", help="skip the run on Optuna's own storage layer"
    )
    parser.add_argument("--keep", action="store_true", help="keep the studies in the storage")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.quick:
        args.trials, args.workers = 100, 4
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = [run_study(args, "trialq"), run_sampler_alone(args)]
    if not args.no_baseline:
        runs.append(run_study(args, "optuna"))
    for summary in runs:
        print(f"\n== {summary['variant']}")
        print_summary(summary)
    trialq, sampler = runs[0], runs[1]
    trialq_ms, sampler_ms = (run["driver_per_trial_ms"]["mean"] for run in (trialq, sampler))
    above, ratio_to_sampler = trialq_ms - sampler_ms, trialq_ms / sampler_ms
    above_cpu = trialq["driver_cpu_per_trial_ms"] - sampler["driver_cpu_per_trial_ms"]
    print(
        f"\ntrialq's driver above the sampler alone: {above:.1f} ms a trial "
        f"({above_cpu:.1f} ms CPU), {ratio_to_sampler:.2f}x its time"
    )
    if len(runs) == 3:
        ratio = runs[2]["driver_per_trial_ms"]["mean"] / trialq["driver_per_trial_ms"]["mean"]
        print(f"trialq's driver: {ratio:.1f}x less time a trial than on Optuna's storage layer")
    result = {
        "benchmark": "driver",
        "storage": args.storage.split(":", 1)[0],
        "workers": args.workers,
        "sampler": args.sampler,
        "environment": environment(),
        "runs": runs,
    }
    out = args.out / f"driver-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
