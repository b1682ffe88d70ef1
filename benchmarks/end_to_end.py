"""What a user sees: trials end to end through `submit-study --local`, against peers in the
same run (issue 28, items 5 and 6).

    python -m benchmarks.end_to_end [--quick] [--only overhead,startup] [--repeats N]

`overhead`: no-op trials, one in flight and two, run four ways:

- `trialq`: `submit-study SPEC --local --workers K` in a process of its own;
- `optuna-fork`: Optuna's `study.optimize(n_jobs=K)` forking a process per trial;
- `optuna-spawn`: the same with a spawned process per trial;
- `ray-tune`: Ray Tune with `reuse_actors=False` (a fresh actor, so a fresh process, per
  trial) and Optuna's search. Not a dependency of trialq: `pip install 'ray[tune]'` to run
  it; without it the row says it was skipped.

Every trial stamps when it started and ended (`time.time()`, returned as metrics), so the
figures come from the trials themselves: a trial's cost is the steady-state cycle, the time
from the first trial's end to the last's divided by the trials between (start-up and shutdown
left out: `startup` measures them). All use Optuna's random sampler, so the sampler's cost is
no part of it.

`startup`: `submit-study --local --workers 2` on a 20-trial study of 1 s trials (2 in flight):
seconds from the command's start to its first trial's start, from the last trial's end to
the command's exit, and the whole run's wall time, against Optuna in one process with
`n_jobs=2` running the same trials (threads, each sleeping 1 s).

Each case runs `--repeats` times (default 3); the table gives medians and spreads, and the
goals are read as ratios against the peers measured in the same run. Writes JSON under
benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import optuna

from benchmarks.stamped_trials import stamped_noop, stamped_second

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
SUBMIT = [sys.executable, "-m", "trialq.cli"]


# --- the trials ---------------------------------------------------------------------------

TRIALS: dict[str, Callable[..., dict[str, float]]] = {
    "stamped_noop": stamped_noop,
    "stamped_second": stamped_second,
}
"""In `benchmarks.stamped_trials`, which imports no framework: each trial process imports it
afresh, and `--local` preloads nothing for it."""


# --- trialq through submit-study ----------------------------------------------------------


def run_trialq(
    function: str, n_trials: int, in_flight: int, folder: Path, preload: str | None = None
) -> dict[str, Any]:
    """`submit-study --local --workers K` on a spec of `n_trials` trials of `function`; with
    `preload`, `TRIALQ_PRELOAD` set to it (else the default: the trial's module imports no
    framework, so the workers preload none; `tensorflow` is what a Keras study's would)."""
    spec = _write_spec(folder, function, n_trials, in_flight)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALQ_")}
    if preload is not None:
        env["TRIALQ_PRELOAD"] = preload
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = ["submit-study", str(spec), "--local", "--workers", str(in_flight)]
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-c", _SUBMIT_MAIN, *command[1:]],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    exited = time.time()
    if done.returncode != 0:
        raise RuntimeError(f"submit-study exited {done.returncode}: {done.stderr[-2000:]}")
    stamps = _study_stamps(folder / "bench.db")
    return {"started": started, "exited": exited, "stamps": stamps}


_SUBMIT_MAIN = "import sys; from trialq.cli import submit_study_main; sys.exit(submit_study_main())"
"""`submit-study` as its console script runs it (the script's own path is not needed)."""


def _write_spec(folder: Path, function: str, n_trials: int, in_flight: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bench.db").unlink(missing_ok=True)
    spec = folder / "study.toml"
    spec.write_text(
        textwrap.dedent(
            f"""
            [study]
            name = "bench"
            n_trials = {n_trials}
            max_in_flight = {in_flight}
            sampler = "random"
            metric = "value"
            storage = "sqlite:///{folder / "bench.db"}"

            [trial]
            entrypoint = "benchmarks.stamped_trials:{function}"

            [space.x]
            type = "float"
            low = -1.0
            high = 1.0
            """
        )
    )
    return spec


def _study_stamps(db: Path) -> list[tuple[float, float]]:
    """Each trial's (start, end) as it stamped them, in order of start."""
    study = optuna.load_study(study_name="bench", storage=f"sqlite:///{db}")
    stamps = []
    for trial in study.get_trials(deepcopy=False):
        attrs = trial.user_attrs
        metrics = attrs.get("metrics", attrs)
        stamps.append((float(metrics["started_at"]), float(metrics["ended_at"])))
    return sorted(stamps)


# --- Optuna with a process per trial, and in one process -----------------------------------


def run_optuna(
    function: str, n_trials: int, in_flight: int, start_method: str | None
) -> dict[str, Any]:
    """`study.optimize(n_jobs=K)`: each trial in a process started by `start_method`, or in
    the study's own threads (None)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    stamps: list[tuple[float, float]] = []
    context = multiprocessing.get_context(start_method) if start_method else None

    def objective(trial: optuna.Trial) -> float:
        params = {"x": trial.suggest_float("x", -1.0, 1.0)}
        metrics = _in_process(context, function, params)
        stamps.append((metrics["started_at"], metrics["ended_at"]))
        return metrics["value"]

    started = time.time()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(objective, n_trials=n_trials, n_jobs=in_flight)
    return {"started": started, "exited": time.time(), "stamps": sorted(stamps)}


def _in_process(context: Any, function: str, params: dict[str, Any]) -> dict[str, float]:
    if context is None:
        return TRIALS[function](params)
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(function, params, sender))
    child.start()
    sender.close()
    metrics: dict[str, float] = receiver.recv()
    child.join()
    return metrics


def _child(function: str, params: dict[str, Any], sender: Any) -> None:
    sender.send(TRIALS[function](params))


# --- Ray Tune -------------------------------------------------------------------------------


def ray_missing() -> str | None:
    """Why Ray Tune cannot run here, or None."""
    try:
        import ray  # noqa: F401
        from ray import tune  # noqa: F401
        from ray.tune.search.optuna import OptunaSearch  # noqa: F401
    except ImportError as exc:
        return f"ray-tune skipped: {exc.name or exc} not installed (pip install 'ray[tune]')"
    return None


def run_ray(function: str, n_trials: int, in_flight: int) -> dict[str, Any]:
    """Ray Tune, a fresh actor per trial (`reuse_actors=False`), Optuna's random sampler."""
    import ray
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    trial_function = TRIALS[function]

    def trainable(config: dict[str, Any]) -> dict[str, float]:
        return trial_function(config)

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")

    started = time.time()
    ray.init(
        num_cpus=in_flight, include_dashboard=False, log_to_driver=False, configure_logging=False
    )
    try:
        search = OptunaSearch(
            sampler=optuna.samplers.RandomSampler(seed=0), metric="value", mode="min"
        )
        tuner = tune.Tuner(
            trainable,
            param_space={"x": tune.uniform(-1.0, 1.0)},
            tune_config=tune.TuneConfig(
                num_samples=n_trials,
                max_concurrent_trials=in_flight,
                reuse_actors=False,
                search_alg=search,
            ),
            run_config=tune.RunConfig(verbose=0, storage_path=tempfile.mkdtemp()),
        )
        grid = tuner.fit()
        stamps = [(float(r.metrics["started_at"]), float(r.metrics["ended_at"])) for r in grid]
    finally:
        ray.shutdown()
    return {"started": started, "exited": time.time(), "stamps": sorted(stamps)}


# --- figures ----------------------------------------------------------------------------------


def figures(run: dict[str, Any]) -> dict[str, float]:
    """The steady-state cycle a trial, the start-up to the first trial, the shutdown after
    the last, and the wall time, in seconds."""
    stamps: list[tuple[float, float]] = run["stamps"]
    ends = sorted(end for _, end in stamps)
    cycle = (ends[-1] - ends[0]) / max(1, len(ends) - 1)
    return {
        "per_trial_s": cycle,
        "to_first_trial_s": stamps[0][0] - run["started"],
        "after_last_trial_s": run["exited"] - ends[-1],
        "wall_s": run["exited"] - run["started"],
    }


def summary(values: list[float]) -> dict[str, float]:
    """Median, lowest and highest of the repeats."""
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def repeated(runner: Callable[[], dict[str, Any]], repeats: int) -> dict[str, Any]:
    """Each figure over `repeats` runs: every value, and its median and spread."""
    runs = [figures(runner()) for _ in range(repeats)]
    return {
        key: {"runs": [r[key] for r in runs], **summary([r[key] for r in runs])} for key in runs[0]
    }


# --- the two parts ------------------------------------------------------------------------


APPROACHES: set[str] | None = None
"""`--approaches`: the only ones run (None: all)."""


def overhead_part(n_trials: int, repeats: int, folder: Path) -> list[dict[str, Any]]:
    """No-op trials, one and two in flight, four ways."""
    rows = []
    skipped = ray_missing()
    for in_flight in (1, 2):
        runners: dict[str, Callable[[], dict[str, Any]] | None] = {
            "trialq": lambda k=in_flight: run_trialq("stamped_noop", n_trials, k, folder),
            "trialq-tf": lambda k=in_flight: run_trialq(
                "stamped_noop", n_trials, k, folder, preload="tensorflow"
            ),
            "optuna-fork": lambda k=in_flight: run_optuna("stamped_noop", n_trials, k, "fork"),
            "optuna-spawn": lambda k=in_flight: run_optuna("stamped_noop", n_trials, k, "spawn"),
            "ray-tune": None
            if skipped
            else lambda k=in_flight: run_ray("stamped_noop", n_trials, k),
        }
        for approach, runner in runners.items():
            if APPROACHES is not None and approach not in APPROACHES:
                continue
            _say(f"overhead: {approach}, {in_flight} in flight, {n_trials} trials x {repeats}")
            row: dict[str, Any] = {
                "part": "overhead",
                "approach": approach,
                "in_flight": in_flight,
                "trials": n_trials,
            }
            if runner is None:
                row["skipped"] = skipped
            else:
                row.update(repeated(runner, repeats))
            rows.append(row)
    return rows


def startup_part(n_trials: int, repeats: int, folder: Path) -> list[dict[str, Any]]:
    """A short study of 1 s trials, two in flight: trialq --local against Optuna's threads."""
    rows = []
    runners = {
        "trialq": lambda: run_trialq("stamped_second", n_trials, 2, folder),
        "trialq-tf": lambda: run_trialq(
            "stamped_second", n_trials, 2, folder, preload="tensorflow"
        ),
        "optuna-threads": lambda: run_optuna("stamped_second", n_trials, 2, None),
    }
    for approach, runner in runners.items():
        if APPROACHES is not None and approach not in APPROACHES:
            continue
        _say(f"startup: {approach}, 2 in flight, {n_trials} trials of 1 s x {repeats}")
        row = {"part": "startup", "approach": approach, "in_flight": 2, "trials": n_trials}
        rows.append({**row, **repeated(runner, repeats)})
    return rows


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each overhead row against the forked process per trial at the same number in flight;
    each start-up row's wall time against Optuna's threads."""
    peers = {
        (r["part"], r["in_flight"]): r
        for r in rows
        if r["approach"] in ("optuna-fork", "optuna-threads")
    }
    for row in rows:
        peer = peers.get((row["part"], row["in_flight"]))
        if peer is None or "skipped" in row:
            continue
        key = "per_trial_s" if row["part"] == "overhead" else "wall_s"
        row["vs_peer"] = row[key]["median"] / peer[key]["median"]


def print_table(rows: list[dict[str, Any]]) -> None:
    """Medians with the spread of the repeats (min-max) in brackets."""
    print(
        f"{'part':9} {'approach':16} {'k':>2} {'per trial s':>22} {'to 1st trial s':>18} "
        f"{'after last s':>18} {'wall s':>18} {'vs peer':>8}"
    )
    for row in rows:
        head = f"{row['part']:9} {row['approach']:16} {row['in_flight']:>2}"
        if "skipped" in row:
            print(f"{head} {row['skipped']}")
            continue
        cells = [
            _cell(row[key], 4 if key == "per_trial_s" else 2)
            for key in ("per_trial_s", "to_first_trial_s", "after_last_trial_s", "wall_s")
        ]
        ratio = f"{row['vs_peer']:.2f}x" if "vs_peer" in row else ""
        print(f"{head} {cells[0]:>22} {cells[1]:>18} {cells[2]:>18} {cells[3]:>18} {ratio:>8}")


def _cell(figure: dict[str, float], digits: int) -> str:
    return f"{figure['median']:.{digits}f} [{figure['min']:.{digits}f}-{figure['max']:.{digits}f}]"


def environment() -> dict[str, Any]:
    """What the numbers were measured on (no paths, nothing secret)."""
    versions = {}
    for package in ("trialq", "optuna", "celery", "redis", "ray"):
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


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.end_to_end",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--quick", action="store_true", help="fewer trials and one repeat")
    parser.add_argument("--only", default="overhead,startup", help="parts to run")
    parser.add_argument("--repeats", type=int, help="runs of each case (default 3; quick 1)")
    parser.add_argument("--noop", type=int, help="no-op trials a run (default 40; quick 15)")
    parser.add_argument("--approaches", help="comma-separated approaches (default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    noop = args.noop or (15 if args.quick else 40)
    parts = set(args.only.split(","))
    global APPROACHES
    APPROACHES = set(args.approaches.split(",")) if args.approaches else None
    before = environment()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        if "overhead" in parts:
            rows += overhead_part(noop, repeats, Path(tmp) / "overhead")
        if "startup" in parts:
            rows += startup_part(20, repeats, Path(tmp) / "startup")
    add_ratios(rows)
    print_table(rows)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"end_to_end-{stamp}.json"
    result = {
        "benchmark": "end_to_end",
        "started": stamp,
        "repeats": repeats,
        "environment_before": before,
        "environment_after": environment(),
        "rows": rows,
    }
    path.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
