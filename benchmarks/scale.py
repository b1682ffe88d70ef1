"""How the driver's cost a trial holds up as a study grows, and what it leaves in Redis.

    python -m benchmarks.scale [--quick] [--sizes 1000 10000] [--in-flight 8 128]
                               [--storages sqlite postgresql] [--samplers auto random]

Each row runs one study of no-op trials (`benchmarks.trials:noop`) through `--workers`
local workers (default 4, nothing preloaded) with the real `StudyDriver` in this process,
`--in-flight` trials at once (8: as many as the workers' slots and their queue; 128: a wide
study), on SQLite or PostgreSQL, with trialq's default sampler (`auto`: TPE at these sizes)
or the random one. It measures, in the first and the last 10 % of the study's trials, the
trials finished a second and the driver thread's own CPU a trial (`time.thread_time` of the
thread that runs the loop, read as each pass reports progress); and, once the study has
ended, what is left in the cluster's Redis that is not study-level (workers' heartbeats,
kombu's bindings): keys and bytes a trial, waited for up to `--settle-s` (60 s: the goal is
0 a minute after the study ends).

Beside each storage and sampler, Optuna's own scale-out, measured in the same run: `--workers`
processes running `study.optimize` of the same no-op objective on one shared storage (its
TPE with the constant liar, or random), each process's CPU a trial in the same 10 % windows.

`--quick`: 1,000 trials, SQLite, 8 in flight with both samplers and 128 with random (a few
minutes on 2 cores). Writes JSON under benchmarks/results/ and prints a table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import resource
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import redis
import sqlalchemy

from benchmarks import driver as driver_bench
from benchmarks.overhead import RESULTS, ROOT, environment, tree_path
from benchmarks.search_objectives import OBJECTIVES
from benchmarks.virtual_cluster import VirtualClock, VirtualCluster
from trialq._celery.dispatcher import CeleryDispatcher
from trialq.driver.ledger import budget_for
from trialq.driver.loop import DriverOptions, StudyDriver
from trialq.driver.outage import Outages
from trialq.driver.progress import Counts
from trialq.driver.study import open_study
from trialq.local import LocalCluster
from trialq.settings import Settings
from trialq.spec import StudySpec, load_spec

POSTGRES = "postgresql+psycopg2://postgres@127.0.0.1:5432/trialq_bench"
"""The PostgreSQL database of the rows on PostgreSQL (`TRIALQ_BENCH_POSTGRES` to choose another),
made on first use where the server has none of that name."""
STUDY_LEVEL = (b"trialq:worker:", b"trialq:worker-gpus:", b"_kombu.binding",
               b"trialq:queue-running:", b"trialq:checkpoints:orphaned")  # fmt: skip
"""Keys that do not grow with the trials: a few per worker or queue."""
WINDOW = 0.1


@dataclass
class Phases:
    """A progress sink that notes, each time the finished count grows, when (wall clock) and
    how much CPU the driver's thread had used by then."""

    marks: list[tuple[int, float, float]] = field(default_factory=list)

    def update(self, counts: Counts, best: float | None, running: int) -> None:
        if not self.marks or counts.finished > self.marks[-1][0]:
            self.marks.append((counts.finished, time.perf_counter(), time.thread_time()))

    def trial_failed(self, line: str) -> None:
        """Nothing: a no-op trial does not fail."""

    def windows(self, n: int, started: tuple[float, float]) -> dict[str, Any]:
        """Trials/s and driver CPU ms a trial over the first and the last `WINDOW` of `n`."""
        edge = max(1, int(n * WINDOW))
        first_end = _at(self.marks, edge)
        last_start, end = _at(self.marks, n - edge), self.marks[-1]
        first = _rates(edge, started, first_end[1:])
        last = _rates(end[0] - last_start[0], last_start[1:], end[1:])
        whole = _rates(end[0], started, end[1:])
        return {"first": first, "last": last, "whole_cpu_ms": whole["cpu_ms"],
                "cpu_growth": _ratio(last["cpu_ms"], first["cpu_ms"])}  # fmt: skip


def _at(marks: list[tuple[int, float, float]], finished: int) -> tuple[int, float, float]:
    return next(mark for mark in marks if mark[0] >= finished)


def _rates(trials: int, start: tuple[float, float], end: tuple[float, float]) -> dict[str, float]:
    wall, cpu = end[0] - start[0], end[1] - start[1]
    return {"trials_per_s": round(trials / wall, 1), "cpu_ms": round(1e3 * cpu / trials, 2)}


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 2) if b else None


def write_spec(folder: Path, name: str, n: int, in_flight: int, sampler: str) -> Path:
    """The driver benchmark's study of no-op trials, with room for a slow, loaded machine."""
    return driver_bench.write_spec(folder, name, n, in_flight, sampler, timeout_s=600)


def storage_url(kind: str, folder: Path) -> str:
    return f"sqlite:///{folder / 'scale.db'}" if kind == "sqlite" else postgres_database()


def postgres_database() -> str:
    """`TRIALQ_BENCH_POSTGRES` or `POSTGRES`, its database made if the server lacks it."""
    url = sqlalchemy.make_url(os.environ.get("TRIALQ_BENCH_POSTGRES", POSTGRES))
    server = sqlalchemy.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with server.connect() as connection:
            known = "select 1 from pg_database where datname = :name"
            if connection.execute(sqlalchemy.text(known), {"name": url.database}).first() is None:
                connection.execute(sqlalchemy.text(f'create database "{url.database}"'))
    finally:
        server.dispose()
    return url.render_as_string(hide_password=False)


def left_in_redis(url: str, n: int, settle_s: float) -> dict[str, Any]:
    """Keys that are not study-level, waited for up to `settle_s`; and Redis's memory."""
    client = redis.Redis.from_url(url)
    deadline, started = time.monotonic() + settle_s, time.monotonic()
    while True:
        left = [k for k in client.keys("*") if not k.startswith(STUDY_LEVEL)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    memory = sum(client.memory_usage(k) or 0 for k in left)
    return {
        "keys_left": len(left),
        "keys_per_trial": round(len(left) / n, 3),
        "bytes_per_trial": round(memory / n, 1),
        "settled_in_s": round(time.monotonic() - started, 1),
        "used_memory_mb": round(client.info("memory")["used_memory"] / 2**20, 2),
        "examples": sorted(k.decode() for k in left)[:3],
    }


def run_trialq(
    args: argparse.Namespace, n: int, in_flight: int, kind: str, sampler: str, askers: int = 0
) -> dict:
    name = f"scale-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        spec = with_askers(load_spec(write_spec(folder, name, n, in_flight, sampler)), askers)
        url = storage_url(kind, folder)
        study = open_study(spec, url)
        env = {"PYTHONPATH": tree_path(), "TRIALQ_PRELOAD": "none"}
        try:
            with LocalCluster(args.workers, "gpu", ("benchmarks",), extra_env=env) as cluster:
                dispatcher = CeleryDispatcher(Settings(broker_url=cluster.broker_url))
                phases = Phases()
                driver = StudyDriver(
                    spec, study, dispatcher, phases, DriverOptions(max_in_flight=in_flight),
                    budget=budget_for(spec, n),
                )  # fmt: skip
                started = (time.perf_counter(), time.thread_time())
                process_cpu, children = time.process_time(), children_cpu()
                driver.run()
                wall_s = time.perf_counter() - started[0]
                process_cpu = time.process_time() - process_cpu
                children = children_cpu() - children  # the ask processes: workers still run
                left = left_in_redis(cluster.broker_url, n, args.settle_s)
        finally:
            optuna.delete_study(study_name=name, storage=url)
    return {
        "arm": "trialq", "trials": n, "in_flight": in_flight, "storage": kind,
        "sampler": sampler, "wall_s": round(wall_s, 1),
        "trials_per_s": round(n / wall_s, 1),
        "process_cpu_ms": round(1e3 * process_cpu / n, 2), **asking(driver, n, children),
        **phases.windows(n, started), "redis": left,
    }  # fmt: skip


def drive(driver: StudyDriver, cluster: VirtualCluster, clock: VirtualClock, n: int) -> None:
    """The driver's own `run`, its real-time pause aside: each pass sends what its commit
    wrote (waiting for the commit, in real time), hands its ask processes what changed,
    then the clock jumps to the next end."""
    outages = Outages(driver.options.outage_limit_s, clock)
    idle = 0
    new_trials = driver.sender.new_trials
    new_trials.start_asking(driver.spec.study.ask_processes)
    try:
        while driver._step(outages):
            while driver.sender.recording:
                driver.sender.send_recorded(clock() + 60.0)
            finished = driver.counts.finished
            new_trials.sync_asking(n - finished - driver.sender.outstanding)
            upcoming = cluster.next_event(clock.now)
            idle = idle + 1 if upcoming is None else 0
            assert idle < 100, "the driver waits for trials the cluster does not run"
            clock.now = clock.now if upcoming is None else upcoming
    finally:
        new_trials.stop_asking()


def with_askers(spec: StudySpec, processes: int) -> StudySpec:
    """`spec` with `[study] ask_processes` set."""
    study = spec.study.model_copy(update={"ask_processes": processes})
    return spec.model_copy(update={"study": study})


def asking(driver: StudyDriver, n: int, children_cpu_s: float) -> dict[str, Any]:
    """The ask processes' part: their number, the share of trials whose params they drew,
    and their CPU a trial (`children_cpu_s`: what the run's reaped children used)."""
    pool = driver.sender.new_trials.pool
    return {
        "ask_processes": driver.spec.study.ask_processes,
        "drawn_share": round(pool.drawn / n, 3) if pool else 0.0,
        "askers_cpu_ms": round(1e3 * children_cpu_s / n, 2),
    }


def children_cpu() -> float:
    """CPU seconds used by this process's reaped children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_virtual(n: int, in_flight: int, kind: str, sampler: str, askers: int = 0) -> dict:
    """The driver alone: the real loop, storage and sampler, trials run by a simulated
    cluster on a virtual clock (`benchmarks.virtual_cluster`), so 10,000 trials take as long
    as the driver's own work (no Redis, no workers: nothing is left in Redis)."""
    objective = OBJECTIVES["branin"]
    name = f"scale-virtual-{uuid.uuid4().hex[:8]}"
    raw = {
        "path": ROOT / "scale.toml",
        "study": {"name": name, "n_trials": n, "max_in_flight": in_flight, "sampler": sampler,
                  "sampler_args": {"seed": 0}, "direction": "minimize", "pruner": "none"},
        "trial": {"entrypoint": "benchmarks.trials:noop"},  # never run
        "space": objective.space,
    }  # fmt: skip
    spec = with_askers(StudySpec.model_validate(raw), askers)
    with tempfile.TemporaryDirectory() as tmp:
        url = storage_url(kind, Path(tmp))
        study = open_study(spec, url)
        clock = VirtualClock()
        cluster = VirtualCluster(objective, 0, clock)
        phases = Phases()
        options = DriverOptions(max_in_flight=in_flight, poll_interval_s=0.0, clock=clock)
        driver = StudyDriver(spec, study, cluster, phases, options, budget=budget_for(spec, n))
        try:
            driver.ledger.open()
            started = (time.perf_counter(), time.thread_time())
            process_cpu, children = time.process_time(), children_cpu()
            drive(driver, cluster, clock, n)
            driver._store.flush()
            wall_s = time.perf_counter() - started[0]
            process_cpu, children = time.process_time() - process_cpu, children_cpu() - children
        finally:
            optuna.delete_study(study_name=name, storage=url)
    return {
        "arm": "virtual", "trials": n, "in_flight": in_flight, "storage": kind,
        "sampler": sampler, "wall_s": round(wall_s, 1), "trials_per_s": round(n / wall_s, 1),
        "process_cpu_ms": round(1e3 * process_cpu / n, 2), **asking(driver, n, children),
        **phases.windows(n, started),
    }  # fmt: skip


def _optimize_part(url: str, name: str, sampler: str, n: int, seed: int) -> list[tuple]:
    """One of Optuna's processes: `n` trials of the no-op objective; (number, end, CPU used)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    chosen: optuna.samplers.BaseSampler
    if sampler == "random":
        chosen = optuna.samplers.RandomSampler(seed=seed)
    else:
        chosen = optuna.samplers.TPESampler(seed=seed, constant_liar=True)
    study = optuna.load_study(study_name=name, storage=url, sampler=chosen)
    ends: list[tuple] = []

    def objective(trial: optuna.Trial) -> float:
        trial.suggest_int("units", 4, 32)
        trial.suggest_float("learning_rate", 1e-4, 1e-1, log=True)
        return trial.suggest_float("x", -1.0, 1.0)

    def noted(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        ends.append((trial.number, time.perf_counter(), time.process_time()))

    started = (-1, time.perf_counter(), time.process_time())
    study.optimize(objective, n_trials=n, callbacks=[noted])
    return [started, *ends]


def run_optuna(args: argparse.Namespace, n: int, kind: str, sampler: str) -> dict:
    """Optuna's scale-out: `args.workers` processes optimizing one study on one storage."""
    name = f"scale-optuna-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        url = storage_url(kind, Path(tmp))
        optuna.create_study(study_name=name, storage=url, direction="maximize")
        parts = [n // args.workers + (i < n % args.workers) for i in range(args.workers)]
        try:
            started = time.perf_counter()
            with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
                ends = pool.starmap(
                    _optimize_part, [(url, name, sampler, k, i) for i, k in enumerate(parts)]
                )
            wall_s = time.perf_counter() - started
        finally:
            optuna.delete_study(study_name=name, storage=url)
    cpu_of: dict[int, float] = {}  # each trial's CPU in the process that ran it
    for process in ends:
        for before, after in itertools.pairwise(process):
            cpu_of[after[0]] = after[2] - before[2]
    finished = sorted(end[1] for process in ends for end in process[1:])
    edge = max(1, int(n * WINDOW))
    numbers = sorted(cpu_of)

    def window(trials: list[int], start: float, end: float) -> dict[str, float]:
        cpu = sum(cpu_of[t] for t in trials)
        return {"trials_per_s": round(len(trials) / (end - start), 1),
                "cpu_ms": round(1e3 * cpu / len(trials), 2)}  # fmt: skip

    first = window(numbers[:edge], min(p[0][1] for p in ends), finished[edge - 1])
    last = window(numbers[-edge:], finished[-edge - 1], finished[-1])
    return {
        "arm": f"optuna x{args.workers}", "trials": n, "in_flight": args.workers, "storage": kind,
        "sampler": sampler, "wall_s": round(wall_s, 1), "trials_per_s": round(n / wall_s, 1),
        "first": first, "last": last, "cpu_growth": _ratio(last["cpu_ms"], first["cpu_ms"]),
    }  # fmt: skip


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'arm':<10} {'trials':>6} {'flight':>6} {'storage':<10} {'sampler':<7} {'askers':>6} "
        f"{'trials/s':>8} {'first /s':>8} {'last /s':>8} {'CPU ms first':>12} "
        f"{'last':>6} {'all':>6} {'growth':>6} {'keys/trial':>10} {'B/trial':>8}"
    )
    for r in rows:
        left = r.get("redis", {})
        print(
            f"{r['arm']:<10} {r['trials']:>6} {r['in_flight']:>6} {r['storage']:<10} "
            f"{r['sampler']:<7} {r.get('ask_processes', '-')!s:>6} "
            f"{r['trials_per_s']:>8} {r['first']['trials_per_s']:>8} "
            f"{r['last']['trials_per_s']:>8} {r['first']['cpu_ms']:>12} "
            f"{r['last']['cpu_ms']:>6} {r.get('whole_cpu_ms', '-')!s:>6} {r['cpu_growth']!s:>6} "
            f"{left.get('keys_per_trial', '-')!s:>10} {left.get('bytes_per_trial', '-')!s:>8}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--in-flight", type=int, nargs="+", default=[8, 128])
    parser.add_argument("--storages", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--samplers", nargs="+", default=["auto", "random"])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--settle-s", type=float, default=60.0)
    parser.add_argument("--no-baseline", action="store_true", help="skip Optuna's scale-out")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--virtual",
        action="store_true",
        help="the driver alone, trials simulated on a virtual clock (no workers, no Redis)",
    )
    parser.add_argument(
        "--ask-processes", type=int, nargs="+", default=[0],
        help="[study] ask_processes of the trialq rows, each a row of its own (0: none)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if any(k < 0 for k in args.ask_processes):
        parser.error("--ask-processes: counts of processes, 0 or more")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if args.quick:
        plan = [(1000, 8, "sqlite", "auto"), (1000, 8, "sqlite", "random"),
                (1000, 128, "sqlite", "random")]  # fmt: skip
    else:
        plan = [(n, k, s, m) for n in args.sizes for s in args.storages for m in args.samplers
                for k in args.in_flight]  # fmt: skip
    rows = []
    for (n, in_flight, kind, sampler), askers in itertools.product(plan, args.ask_processes):
        if args.virtual:
            rows.append(run_virtual(n, in_flight, kind, sampler, askers))
        else:
            rows.append(run_trialq(args, n, in_flight, kind, sampler, askers))
        print_table(rows[-1:])
    if not args.no_baseline and not args.virtual:
        for n, kind, sampler in dict.fromkeys((n, s, m) for n, _, s, m in plan):
            rows.append(run_optuna(args, n, kind, sampler))
            print_table(rows[-1:])
    print()
    print_table(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"scale-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"benchmark": "scale", "environment": environment(),
                               "workers": args.workers, "rows": rows}, indent=1))  # fmt: skip
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
