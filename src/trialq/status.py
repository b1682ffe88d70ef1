"""`trialq status`: a study's trials, its best value, and the workers alive right now."""

from __future__ import annotations

import json
import sys
from collections import Counter
from typing import Any

import optuna
import redis
from rich.console import Console
from rich.table import Table

from trialq import heartbeat
from trialq.errors import StorageUnreachable, UsageError
from trialq.summary import study_summary


def show_status(study_name: str, storage: str | None, broker: str, as_json: bool) -> int:
    """Print the study's table (or JSON); 0 when shown."""
    if storage is None:
        raise UsageError("trialq status: give --storage or set TRIALQ_STORAGE")
    study = _load(study_name, storage)
    summary = study_summary(study)
    workers = _workers(broker)
    if as_json:
        json.dump({**summary, "workers": workers}, sys.stdout, default=str)
        sys.stdout.write("\n")
        return 0
    console = Console()
    console.print(_trials_table(summary))
    outcomes = Counter(t["user_attrs"].get("outcome", "-") for t in summary["trials"])
    console.print(f"best value: {summary['best_value']}  params: {summary['best_params']}")
    console.print("outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    console.print(f"live workers: {len(workers)}")
    for worker in workers:
        console.print(f"  {worker['name']}  host {worker['host']}  gpu {worker['gpu']}")
    return 0


def _load(study_name: str, storage: str) -> optuna.Study:
    try:
        return optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        raise UsageError(f"trialq status: no study named {study_name!r} in the storage") from None
    except Exception as exc:
        if type(exc).__module__.startswith("sqlalchemy"):
            raise StorageUnreachable(f"storage unreachable: {str(exc).splitlines()[0]}") from None
        raise


def _workers(broker: str) -> list[dict[str, Any]]:
    try:
        client = redis.Redis.from_url(broker, socket_timeout=3)
        return [vars(beat) for beat in heartbeat.live_workers(client)]
    except redis.RedisError:
        return []


def _trials_table(summary: dict[str, Any]) -> Table:
    table = Table(title=f"study {summary['study']}")
    for column in ("number", "state", "outcome", "value", "attempts", "host", "duration s"):
        table.add_column(column)
    for trial in summary["trials"]:
        attrs = trial["user_attrs"]
        values = trial["values"]
        table.add_row(
            str(trial["number"]),
            trial["state"],
            str(attrs.get("outcome", "-")),
            "-" if not values else ", ".join(f"{v:.6g}" for v in values),
            str(attrs.get("attempts", "-")),
            str(attrs.get("worker_host", "-")),
            f"{attrs['duration_s']:.2f}" if "duration_s" in attrs else "-",
        )
    return table
