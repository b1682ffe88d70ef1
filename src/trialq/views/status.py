"""`trialq status`: a study's trials, its best trial, how they ended, what failed and why,
and the live workers with the trial each is running.

Trials come from the Optuna storage (the driver's record); workers and their running
trials from the broker's heartbeat keys. A broker that does not answer leaves the workers
out, with a note, rather than failing the whole command: the storage alone is worth seeing.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna
import redis
from rich import box
from rich.console import Console
from rich.table import Table

from trialq.settings import redacted_url
from trialq.views.rows import (
    TrialRow,
    best_line,
    human_bytes,
    outcome_counts,
    outcome_text,
    trial_rows,
    value_text,
    with_running,
)
from trialq.views.summary import study_summary
from trialq.wire import heartbeat
from trialq.wire.heartbeat import RunningTrial, WorkerBeat
from trialq.wire.messages import LAST_RUN_ATTR

MAX_FAILURES_SHOWN = 10
"""The table has every trial; the 'failed' list below it only the latest few, in full."""

_STYLE = {"ok": "green", "pruned": "yellow", "running": "cyan", "waiting": "dim"}


@dataclass(frozen=True)
class LiveWorker:
    """A worker whose heartbeat is fresh, and the trials its processes claim right now."""

    beat: WorkerBeat
    running: tuple[RunningTrial, ...]

    def as_json(self) -> dict[str, Any]:
        """The heartbeat's fields plus `running`: the trials, as their processes said."""
        return {**asdict(self.beat), "running": [asdict(trial) for trial in self.running]}


LOCAL_BROKER = "local"
"""`trialq:broker`'s value for a study run with `--local`: its Redis and workers stop with
each run, so no broker is asked for its live workers."""


def show_status(study: optuna.Study, broker: str | None, as_json: bool) -> int:
    """Print the study's tables (or JSON); 0 when shown. `broker`: where to ask for live
    workers (named in the output); None for a `--local` study, which has none after its run."""
    workers = live_workers(broker) if broker is not None else []
    running = [trial for worker in workers or [] for trial in worker.running]
    rows = with_running(trial_rows(study), study.study_name, running)
    asked = _broker_text(broker)
    if as_json:
        _print_json(study, rows, workers, asked)
    else:
        _print_tables(study, rows, workers, asked)
    return 0


def last_run_line(record: Any) -> str | None:
    """`last run: stopped by max_wall_s; n_trials 12/40, max_wall_s 3602/3600`."""
    if not isinstance(record, dict) or not isinstance(record.get("budgets"), dict):
        return None
    used = ", ".join(
        f"{name} {row.get('used')}/{row.get('limit')}" for name, row in record["budgets"].items()
    )
    return f"last run: stopped by {record.get('stopped_by')}; {used}"


def _broker_text(broker: str | None) -> str:
    if broker is None:
        return "the study runs with --local: its workers stop with each run"
    return f"asked {redacted_url(broker)}"


def live_workers(broker: str) -> list[LiveWorker] | None:
    """Workers that beat, each with its running trials; None when the broker is away."""
    try:
        client = redis.Redis.from_url(broker, socket_timeout=3)
        beats = heartbeat.live_workers(client)
        running = heartbeat.running_trials(client)
    except redis.RedisError:
        return None
    return [
        LiveWorker(beat, tuple(trial for trial in running if trial.worker == beat.name))
        for beat in beats
    ]


def _print_json(
    study: optuna.Study, rows: list[TrialRow], workers: list[LiveWorker] | None, asked: str
) -> None:
    """`submit-study --json`'s summary, plus outcome counts and the live workers."""
    document = {
        **study_summary(study).to_json(),
        "outcomes": outcome_counts(rows),
        "last_run": study.user_attrs.get(LAST_RUN_ATTR),
        "broker": asked,
        "workers": None if workers is None else [worker.as_json() for worker in workers],
    }
    json.dump(document, sys.stdout, default=str)
    sys.stdout.write("\n")


def _print_tables(
    study: optuna.Study, rows: list[TrialRow], workers: list[LiveWorker] | None, asked: str
) -> None:
    console = Console()
    console.print(trials_table(study.study_name, rows))
    console.print(best_line(study))
    console.print("outcomes: " + outcome_text(rows, "none"))
    last_run = last_run_line(study.user_attrs.get(LAST_RUN_ATTR))
    if last_run:
        console.print(last_run)
    for row in [r for r in rows if r.error][-MAX_FAILURES_SHOWN:]:
        console.print(f"  [red]#{row.number} {row.outcome}[/red]: {row.error}", markup=True)
        if row.record.log_file:
            console.print(f"    log: {row.record.log_file}", markup=False, highlight=False)
    logged = [r.record.log_file for r in rows if r.record.log_file]
    if logged:
        console.print(f"trials' logs: {Path(logged[-1]).parent}", markup=False, highlight=False)
    if workers is None:
        console.print(f"live workers: unknown (the broker did not answer: {asked})")
    elif not workers:
        console.print(f"live workers: none ({asked})")
    else:
        console.print(workers_table(workers))


def trials_table(study_name: str, rows: list[TrialRow]) -> Table:
    """One line per trial: how it ended, where, how long, and how much memory it took.

    GPU columns appear only when some trial has a GPU reading: a CPU study keeps 80 columns.
    """
    gpu = any(r.record.gpu_peak is not None or r.record.gpu_utilization_mean is not None
              for r in rows)  # fmt: skip
    table = Table(
        title=f"study {study_name}",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
    )
    for column in [*_COLUMNS, *(_GPU_COLUMNS if gpu else ()), *_LAST_COLUMNS]:
        if column == "params":  # the one column that folds, so the others stay readable
            table.add_column(column, min_width=7, overflow="fold")
        elif column in ("outcome", "host"):
            table.add_column(column, no_wrap=True)
        else:
            table.add_column(column, justify="right", no_wrap=True)
    for row in rows:
        cells = _cells(row) + (_gpu_cells(row) if gpu else []) + [params_text(row.params)]
        table.add_row(*cells, style=_STYLE.get(row.label, "red"))
    return table


_COLUMNS = ("#", "outcome", "value", "tries", "host", "time s", "peak RSS")
_GPU_COLUMNS = ("peak GPU", "GPU %")
_LAST_COLUMNS = ("params",)


def _cells(row: TrialRow) -> list[str]:
    return [
        str(row.number),
        row.label,
        value_text(row.values),
        "-" if row.record.attempts is None else str(row.record.attempts),
        row.record.worker_host or "-",
        "-" if row.record.duration_s is None else f"{row.record.duration_s:.1f}",
        human_bytes(row.record.peak_rss_bytes),
    ]


def params_text(params: dict[str, Any]) -> str:
    """`lr=0.00316 units=64 act=relu`: floats to 3 significant digits."""
    return " ".join(
        f"{name}={value:.3g}" if isinstance(value, float) else f"{name}={value}"
        for name, value in params.items()
    )


def _gpu_cells(row: TrialRow) -> list[str]:
    util = row.record.gpu_utilization_mean
    return [human_bytes(row.record.gpu_peak), "-" if util is None else f"{util:.0f}"]


def workers_table(workers: list[LiveWorker]) -> Table:
    """The workers that beat now, their GPUs and slots, and the trial each of their
    processes runs."""
    table = Table(title=f"live workers: {len(workers)}", box=box.SIMPLE_HEAD)
    for column in ("worker", "host", "gpu", "queues", "running", "last beat"):
        table.add_column(column, no_wrap=column == "running")
    now = time.time()
    for worker in workers:
        beat = worker.beat
        running = "\n".join(_running_text(trial, now) for trial in worker.running) or "idle"
        since = f"{max(0.0, now - beat.beat_at):.0f} s ago"
        gpu = beat.gpus.describe() if beat.gpus is not None else beat.gpu or "-"
        table.add_row(beat.name, beat.host, gpu, ",".join(beat.queues), running, since)
    return table


def _running_text(trial: RunningTrial, now: float) -> str:
    since = max(0.0, now - trial.started_at)
    return f"{trial.study} #{trial.number} (try {trial.attempt}, {since:.0f} s, pid {trial.pid})"
