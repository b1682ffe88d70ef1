"""What one process per trial costs a trial, for four ways of running the same trials.

    python -m benchmarks.overhead [--quick] [--noop N] [--tf N] [--keras N] [--only A,B]

Approaches (all with one worker, or one loop, and the same trials with the same params):

- `inprocess`: an Optuna loop calling each trial in its own process (no isolation);
- `seed`: the same loop with a `multiprocessing.Process` per trial (trialq's seed);
- `naive`: stock Celery, `worker_max_tasks_per_child=1`, the trial imports its framework;
- `naive+tf-parent`: the same with TensorFlow imported in the worker's parent;
- `trialq-reap`, `trialq-spare`, `trialq-preload`, `trialq`: `trialq worker` with
  `--preload none --spare 0` (prompt replacement only), `--preload none`, `--spare 0`, and
  with its defaults (TensorFlow preloaded, one spare process). The two without a preload run
  the no-op trials only: a TensorFlow trial there pays its import, as under naive Celery.

Workloads: `noop` (nothing), `tf` (one small TensorFlow op) and `keras` (a small Keras model
fitted for an epoch; in-process loop and trialq only: naive runs would take ~8 s a trial).
Celery approaches get all their trials queued at once on an idle, warmed-up worker; the loops
run back to back. A trial's overhead is its share of the wall time minus the work itself
(the in-process loop's median call time); the long-lived process is the loop's, or the
worker's parent. Prints a table, writes JSON and a PNG of RSS against trial number under
benchmarks/results/. Needs no services: an embedded Redis is started on a free port.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import optuna
import psutil
import redis

from benchmarks.params import sample_params
from trialq._celery.dispatcher import CeleryDispatcher
from trialq.local import LocalCluster
from trialq.settings import Settings
from trialq.wire import heartbeat
from trialq.wire.entrypoint import Entrypoint
from trialq.wire.messages import Outcome, TrialRequest, TrialResult

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
POLL_S = 0.002
POLL_WINDOW = 4
TRIAL_TIMEOUT_S = 600.0


def tree_path(*more: str | None) -> str:
    """A PYTHONPATH that puts this tree's `trialq` (src/) and `benchmarks` before `more`: the
    workers and commands a benchmark starts run the code measured, installed or not."""
    return os.pathsep.join(filter(None, [str(ROOT / "src"), str(ROOT), *more]))


DEFAULT_TRIALS = {"noop": 30, "tf": 10, "keras": 100}
QUICK_TRIALS = {"noop": 10, "tf": 3, "keras": 10}
PLAN = {
    "noop": (
        "inprocess", "seed", "naive", "trialq-reap", "trialq-spare", "trialq-preload", "trialq",
    ),
    "tf": ("inprocess", "seed", "naive", "naive+tf-parent", "trialq-preload", "trialq"),
    "keras": ("inprocess", "trialq"),
}  # fmt: skip
TRIALQ_VARIANTS = {
    "trialq-reap": {"TRIALQ_PRELOAD": "none", "TRIALQ_SPARE_PROCESSES": "0"},
    "trialq-spare": {"TRIALQ_PRELOAD": "none", "TRIALQ_SPARE_PROCESSES": "1"},
    "trialq-preload": {"TRIALQ_PRELOAD": "auto", "TRIALQ_SPARE_PROCESSES": "0"},
    "trialq": {},  # the defaults
}


@dataclass
class Run:
    """One approach on one workload: what the sender saw, trial by trial."""

    workload: str
    approach: str
    trials: int
    wall_s: float
    ends: list[float]
    """When each trial's result was seen, in seconds after the run started."""
    rss: list[int]
    """The long-lived process's resident bytes after each trial."""
    pids: list[int]
    durations: list[float] = field(default_factory=list)
    """Time inside the trial function (loops only)."""
    startup_s: float | None = None


# --- the loops ----------------------------------------------------------------------------


def run_loop(mode: str, workload: str, params: list[dict[str, Any]], tmp: Path) -> Run:
    """Run `benchmarks.loops` in a fresh process and read what it wrote."""
    params_path, out_path = tmp / "params.json", tmp / f"{mode}-{workload}.json"
    params_path.write_text(json.dumps(params))
    command = [sys.executable, "-m", "benchmarks.loops", mode, workload, str(params_path)]
    subprocess.run([*command, str(out_path)], check=True, cwd=ROOT, env=_env(), timeout=3600)
    out = json.loads(out_path.read_text())
    records = out["records"]
    return Run(
        workload=workload,
        approach=mode,
        trials=len(records),
        wall_s=records[-1]["end"] - out["started"],
        ends=[r["end"] - out["started"] for r in records],
        rss=[r["rss"] for r in records],
        pids=[r["pid"] for r in records],
        durations=[r["duration"] for r in records],
    )


# --- Celery: naive and trialq -------------------------------------------------------------


def run_naive(workload: str, params: list[dict[str, Any]], broker: str, preload: str) -> Run:
    """Stock Celery with one trial per process; `preload` is imported by the worker's parent."""
    from benchmarks.naive_celery import TASK_NAME, app

    app.conf.broker_url = app.conf.result_backend = broker
    queue = f"naive-{os.getpid()}-{time.monotonic_ns()}"
    env = _env(BENCH_BROKER_URL=broker, NAIVE_PRELOAD=preload)
    command = [
        sys.executable, "-m", "celery", "-A", "benchmarks.naive_celery", "worker",
        "--concurrency", "1", "--max-tasks-per-child", "1", "--prefetch-multiplier", "1",
        "--queues", queue, "--hostname", f"{queue}@%h", "--loglevel", "WARNING",
    ]  # fmt: skip
    started = time.monotonic()
    with _process(command, env) as worker:

        def send(workload: str, trial_params: dict[str, Any]) -> str:
            return str(app.send_task(TASK_NAME, args=[workload, trial_params], queue=queue).id)

        client = redis.Redis.from_url(broker)
        _wait_results(client, [send("noop", params[0])], lambda _: None)  # up and warm
        startup_s = time.monotonic() - started
        run = _send_and_wait(workload, params, send, client, worker.pid, _naive_pid)
    run.approach = "naive+tf-parent" if preload else "naive"
    run.startup_s = startup_s
    return run


def _naive_pid(meta: dict[str, Any]) -> int:
    if meta.get("status") != "SUCCESS":
        raise RuntimeError(f"naive trial failed: {meta.get('result')}")
    return int(meta["result"]["worker_pid"])


def run_trialq(workload: str, params: list[dict[str, Any]], variant: str) -> Run:
    """`trialq worker`, as `--local` starts it (with its own Redis), in the variant's settings."""
    queue = "gpu"
    env = {"PYTHONPATH": tree_path(), **TRIALQ_VARIANTS[variant]}
    started = time.monotonic()
    with LocalCluster(1, queue, ("benchmarks",), extra_env=env) as cluster:
        broker = cluster.broker_url
        dispatcher = CeleryDispatcher(Settings(broker_url=broker))
        client = redis.Redis.from_url(broker)
        parent_pid = next(b.pid for b in heartbeat.live_workers(client) if queue in b.queues)

        def send(workload: str, trial_params: dict[str, Any]) -> str:
            request = TrialRequest(
                study="overhead",
                number=0,
                attempt=1,
                params=trial_params,
                entrypoint=Entrypoint("benchmarks.trials", _FUNCTIONS[workload]),
                timeout_s=TRIAL_TIMEOUT_S,
                hard_limit_s=TRIAL_TIMEOUT_S + 60,
            )
            return dispatcher.submit(request, queue)

        _wait_results(client, [send("noop", params[0])], lambda _: None)
        startup_s = time.monotonic() - started
        run = _send_and_wait(workload, params, send, client, parent_pid, _trialq_pid)
    run.approach = variant
    run.startup_s = startup_s
    return run


_FUNCTIONS = {"noop": "noop", "tf": "tf_op", "keras": "keras_fit"}


def _trialq_pid(meta: dict[str, Any]) -> int:
    if meta.get("status") != "SUCCESS":
        raise RuntimeError(f"trialq trial's process failed: {meta.get('result')}")
    result = TrialResult.model_validate(meta["result"])
    if result.outcome is not Outcome.OK:
        raise RuntimeError(f"trialq trial failed: {result.error}")
    return int(result.worker_pid or 0)


def _send_and_wait(
    workload: str,
    params: list[dict[str, Any]],
    send: Callable[[str, dict[str, Any]], str],
    client: redis.Redis,
    parent_pid: int,
    pid_of: Callable[[dict[str, Any]], int],
) -> Run:
    """Queue every trial at once, then note when each result appears and the parent's RSS."""
    parent = psutil.Process(parent_pid)
    started = time.monotonic()
    ids = [send(workload, p) for p in params]
    seen: dict[str, tuple[float, int, int]] = {}

    def on_result(found: dict[str, dict[str, Any]]) -> None:
        now = time.monotonic() - started
        rss = parent.memory_info().rss
        for task_id, meta in found.items():
            seen[task_id] = (now, rss, pid_of(meta))

    _wait_results(client, ids, on_result)
    ordered = sorted(seen.values())
    return Run(
        workload=workload,
        approach="",
        trials=len(ids),
        wall_s=ordered[-1][0],
        ends=[end for end, _, _ in ordered],
        rss=[rss for _, rss, _ in ordered],
        pids=[pid for _, _, pid in ordered],
    )


def _wait_results(
    client: redis.Redis,
    ids: list[str],
    on_result: Callable[[dict[str, dict[str, Any]]], None],
) -> None:
    """Poll the result backend (one MGET) until every task has a final state."""
    waiting = list(ids)
    deadline = time.monotonic() + TRIAL_TIMEOUT_S * max(1, len(ids))
    while waiting:
        # One worker takes the queue in order: the next few are enough, and polling all of
        # them every 2 ms would take CPU from the worker on a small machine.
        window = waiting[:POLL_WINDOW]
        raws = client.mget([f"celery-task-meta-{task_id}" for task_id in window])
        found = {}
        for task_id, raw in zip(window, raws, strict=True):
            meta = json.loads(raw) if raw else None
            if meta and meta.get("status") in {"SUCCESS", "FAILURE"}:
                found[task_id] = meta
        if found:
            on_result(found)
            waiting = [task_id for task_id in waiting if task_id not in found]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(waiting)} trials never finished")
        time.sleep(POLL_S)


@contextmanager
def _process(command: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """A worker process in its own session; stopped (and its pool with it) afterwards."""
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            yield process
        finally:
            os.killpg(process.pid, signal.SIGQUIT)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALQ_")}
    env["PYTHONPATH"] = tree_path(env.get("PYTHONPATH"))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return {**env, **{k: v for k, v in extra.items() if v}}


# --- summarising ----------------------------------------------------------------------------


def summarise(run: Run, work_s: float) -> dict[str, Any]:
    """Per-trial overhead, RSS growth of the long-lived process, distinct trial processes."""
    cycles = [b - a for a, b in zip([0.0, *run.ends], run.ends, strict=False)]
    growth = run.rss[-1] - run.rss[0]
    return {
        "workload": run.workload,
        "approach": run.approach,
        "trials": run.trials,
        "wall_s": round(run.wall_s, 4),
        "work_s": round(work_s, 6),
        "overhead_s": round(run.wall_s / run.trials - work_s, 4),
        "overhead_p50_s": round(statistics.median(cycles) - work_s, 4),
        "rss_first_mb": round(run.rss[0] / 2**20, 1),
        "rss_growth_mb": round(growth / 2**20, 1),
        "rss_growth_mb_per_trial": round(growth / 2**20 / max(1, run.trials - 1), 2),
        "distinct_pids": len(set(run.pids)),
        "startup_s": None if run.startup_s is None else round(run.startup_s, 2),
    }


def work_per_trial(inprocess: Run) -> float:
    """The trial's own cost: the in-process loop's median call, the first (imports) left out."""
    durations = inprocess.durations[1:] or inprocess.durations
    return statistics.median(durations)


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """`vs_naive`: how many times less overhead (and wall time) than naive Celery."""
    naive = {r["workload"]: r for r in rows if r["approach"] == "naive"}
    for row in rows:
        base = naive.get(row["workload"])
        if base is None:
            row["overhead_vs_naive"] = row["wall_vs_naive"] = None
            continue
        overhead = max(row["overhead_s"], 1e-4)
        row["overhead_vs_naive"] = round(base["overhead_s"] / overhead, 1)
        row["wall_vs_naive"] = round(base["wall_s"] / row["wall_s"], 1)


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'workload':8} {'approach':16} {'trials':>6} {'wall s':>8} {'overhead s':>10} "
        f"{'p50 s':>7} {'naive/this':>10} {'RSS growth MB':>13} {'MB/trial':>8} {'pids':>5}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        ratio = "-" if r["overhead_vs_naive"] is None else f"{r['overhead_vs_naive']:g}x"
        print(
            f"{r['workload']:8} {r['approach']:16} {r['trials']:>6} {r['wall_s']:>8.2f} "
            f"{r['overhead_s']:>10.3f} {r['overhead_p50_s']:>7.3f} {ratio:>10} "
            f"{r['rss_growth_mb']:>13.1f} {r['rss_growth_mb_per_trial']:>8.2f} "
            f"{r['distinct_pids']:>5}"
        )


def plot_rss(runs: list[Run], path: Path) -> bool:
    """RSS of the long-lived process against trial number: in-process loop vs trialq."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workload = next((w for w in ("keras", "tf", "noop") if _has(runs, w)), None)
    if workload is None:
        return False
    figure, axes = plt.subplots(figsize=(7, 4))
    for run in runs:
        if run.workload == workload and run.approach in ("inprocess", "trialq"):
            label = "in-process loop" if run.approach == "inprocess" else "trialq worker (parent)"
            trials = range(1, len(run.rss) + 1)
            axes.plot(trials, [b / 2**20 for b in run.rss], label=label)
    axes.set_xlabel("trial number")
    axes.set_ylabel("resident memory of the long-lived process (MB)")
    axes.set_title(f"RSS over {workload} trials")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return True


def _has(runs: list[Run], workload: str) -> bool:
    approaches = {r.approach for r in runs if r.workload == workload}
    return {"inprocess", "trialq"} <= approaches


def environment() -> dict[str, Any]:
    """What the numbers were measured on (no paths, nothing secret)."""
    versions = {}
    for package in ("celery", "billiard", "kombu", "redis", "optuna", "tensorflow-cpu"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "versions": versions,
    }


# --- main -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.overhead", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few trials: a smoke run")
    for workload, default in DEFAULT_TRIALS.items():
        parser.add_argument(
            f"--{workload}", type=int, metavar="N", help=f"{workload} trials (default {default})"
        )
    parser.add_argument("--only", help="comma-separated approaches to run (default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where JSON and PNG go")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    counts = dict(QUICK_TRIALS if args.quick else DEFAULT_TRIALS)
    for workload in counts:
        if getattr(args, workload) is not None:
            counts[workload] = getattr(args, workload)
    only = set(args.only.split(",")) if args.only else None
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    before = environment()
    runs: list[Run] = []
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(0, "none", ()) as redis_only:
        for workload, n_trials in counts.items():
            if n_trials <= 0:
                continue
            params = sample_params(n_trials)
            work_s = 0.0
            for approach in PLAN[workload]:
                if approach != "inprocess" and only is not None and approach not in only:
                    continue
                print(f"{workload}: {approach} x {n_trials} ...", file=sys.stderr, flush=True)
                run = _run(approach, workload, params, redis_only.broker_url, Path(tmp))
                if approach == "inprocess":
                    work_s = work_per_trial(run)
                runs.append(run)
                rows.append(summarise(run, work_s))
    add_ratios(rows)
    print_table(rows)
    result = {
        "benchmark": "overhead",
        "started": stamp,
        "trials": counts,
        "environment_before": before,
        "environment_after": environment(),
        "rows": rows,
        "runs": [asdict(run) for run in runs],
    }
    json_path = args.out / f"overhead-{stamp}.json"
    json_path.write_text(json.dumps(result, indent=1))
    png_path = args.out / f"overhead-{stamp}-rss.png"
    plotted = plot_rss(runs, png_path)
    print(f"\nwrote {_shown(json_path)}" + (f" and {_shown(png_path)}" if plotted else ""))
    return 0


def _run(approach: str, workload: str, params: list[dict[str, Any]], broker: str, tmp: Path) -> Run:
    if approach in ("inprocess", "seed"):
        return run_loop(approach, workload, params, tmp)
    if approach.startswith("naive"):
        return run_naive(workload, params, broker, "tensorflow" if "tf-parent" in approach else "")
    return run_trialq(workload, params, approach)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    raise SystemExit(main())
