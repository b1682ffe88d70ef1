"""What `python -m benchmarks.gpu` writes: the JSON record and the table printed (and pasted
into the README's "GPU figures"). Pure: figures in, text out; nothing is measured here."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

MiB = 1024 * 1024


def write_json(record: dict[str, Any], path: Path) -> None:
    """The run's record: the machine (`device`), the date, versions, and every figure."""
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def table(record: dict[str, Any]) -> str:
    """The markdown table of a run, headed by what it ran on."""
    device = record["device"]
    head = (
        f"{record['date']}, {device['count']} x {device['name']} "
        f"({device['memory_mib']} MiB), driver {device['driver']}, "
        + ", ".join(f"{k} {v}" for k, v in sorted(record["versions"].items()) if v)
    )
    sections: list[tuple[str, Callable[[Any], list[tuple[str, str]]]]] = [
        ("memory_over_trials", _memory_rows),
        ("throughput", _throughput_rows),
        ("overrun", _overrun_rows),
        ("contexts", _context_rows),
        ("start_cost", _start_rows),
    ]
    # A run of some sections, or one cut at its limit, shows what it measured and no more.
    rows = [row for key, rows_of in sections if key in record for row in rows_of(record[key])]
    if not record.get("complete", True):
        head += " (cut short: only the sections done)"
    lines = [head, "", "| measure | figure |", "|---|---|"]
    return "\n".join(lines + [f"| {name} | {figure} |" for name, figure in rows]) + "\n"


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / MiB:,.0f} MiB"


def _memory_rows(memory: dict[str, Any]) -> list[tuple[str, str]]:
    def span(used: list[int]) -> str:
        return f"{_mib(used[0])} -> {_mib(max(used))} (last {_mib(used[-1])})"

    count = len(memory["in_process"])
    label = f"(a) GPU memory in use over {count} trials"
    return [
        (f"{label}, one process (Optuna)", span(memory["in_process"])),
        (f"{label}, trialq", span(memory["trialq"])),
    ]


def _throughput_rows(throughput: list[dict[str, Any]]) -> list[tuple[str, str]]:
    rows = []
    for run in throughput:
        ok = "all within budget" if run["peaks_within_budget"] else "A PEAK OVER BUDGET"
        over = "device never full" if run["device_never_over"] else "DEVICE OVER ITS MEMORY"
        rows.append((
            f"(b) {run['model']}, {run['per_gpu']} trials per GPU",
            f"{run['trials_per_hour_per_gpu']:,.0f} trials/h per GPU; {ok}; {over}",
        ))  # fmt: skip
    return rows


def _overrun_rows(overrun: dict[str, Any]) -> list[tuple[str, str]]:
    others = ", ".join(overrun["others"])
    return [("(c) one trial at 2x its budget beside 3", f"it: {overrun['hog']}; the 3: {others}")]


def _context_rows(contexts: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [(f"(d) CUDA context, {name}", _mib(used)) for name, used in contexts["cost"].items()]
    cap = contexts["jax_cap"]
    held = "held" if cap["held"] else "NOT HELD"
    rows.append(("(d) JAX's cap", f"{held}: peak {_mib(cap['peak'])} of {_mib(cap['budget'])}"))
    return rows


def _start_rows(start: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (f"(e) trial start, {label}", f"{seconds:.3f} s (median)")
        for label, seconds in start.items()
    ]
