"""What `python -m benchmarks.gpu` writes: the JSON record and the table printed (and pasted
into the README's "GPU figures"). Pure: figures in, text out; nothing is measured here."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

MiB = 1024 * 1024


def write_json(record: dict[str, Any], path: Path) -> None:
    """The run's record: the machine (`device`), the date, versions, and every figure.
    Written whole to a file beside it, then moved over it: a call cut mid-write leaves the
    last whole record, never half of one."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    partial.replace(path)


class Record:
    """The record of one call, saved whole each time a part of it ends."""

    def __init__(self, head: dict[str, Any], path: Path | None) -> None:
        self.data: dict[str, Any] = {**head, "sections_done": [], "not_run": [], "complete": False}
        self.path = path
        self.save()

    def put(self, key: str, value: Any) -> None:
        """A section's figures so far (a part of it or all): saved at once."""
        self.data[key] = value
        self.save()

    def done(self, section: str) -> None:
        self.data["sections_done"].append(section)
        self.save()

    def not_run(self, what: str, why: str) -> None:
        self.data["not_run"].append({"what": what, "why": why})
        self.save()

    def save(self) -> None:
        if self.path is not None:
            write_json(self.data, self.path)


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
        ("shared_gpu", _shared_rows),
        ("keras", _keras_rows),
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

    rows = []
    for key, label in (("in_process", "no empty_cache"), ("in_process_empty_cache", "empty_cache")):
        if key in memory:
            part = memory[key]
            rows.append((
                f"(a) memory at each start, {len(part['used_at_start'])} trials in one process, "
                f"{label}",
                f"{span(part['used_at_start'])}; after the last: allocated "
                f"{_mib(part['allocated_after'][-1])}, reserved {_mib(part['reserved_after'][-1])}",
            ))  # fmt: skip
    if "trialq" in memory:
        rows.append(("(a) the same, trialq", span(memory["trialq"])))
    return rows


def _throughput_rows(throughput: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for model, found in throughput.items():
        if model == "not_run":
            continue
        summary = found["summary"]
        for packing, figures in summary["trials_per_hour_per_gpu"].items():
            rows.append((
                f"(b) {model}, {packing} a GPU, trials/h per GPU",
                f"median {figures['median']:,.0f} of {figures['runs']} runs "
                f"({figures['min']:,.0f}-{figures['max']:,.0f})",
            ))  # fmt: skip
        held = [
            "all ok" if summary["all_ok"] else "NOT ALL OK",
            "within budget" if summary["all_within_budget"] else "A PEAK OVER BUDGET",
            "device never at its total" if summary["device_never_at_total"] else "DEVICE AT TOTAL",
            f"{summary['notes']} notes",
        ]
        ratios = ", ".join(f"{k}: {v}x" for k, v in summary["ratio_of_medians"].items())
        rows.append((f"(b) {model}, ratios of medians", f"{ratios}; {'; '.join(held)}"))
    if throughput.get("not_run"):
        rows.append(("(b) runs not started (deadline)", str(len(throughput["not_run"]))))
    return rows


def _shared_rows(shared: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for label, part in shared.items():
        if "not_run" in part:
            rows.append((f"(f) two workers on one GPU, {label}", f"not run: {part['not_run']}"))
            continue
        rows.append((
            f"(f) two workers on one GPU, {label}",
            f"{part['outcomes']}; peak {_mib(part['peak_max_bytes'])} of "
            f"{_mib(part['budget_min_bytes'])}; "
            f"device at most {_mib(part['device_used_max_bytes'])}",
        ))  # fmt: skip
    return rows


def _keras_rows(keras: dict[str, Any]) -> list[tuple[str, str]]:
    rows = []
    for backend, part in keras.items():
        if "not_run" in part:
            rows.append((f"(g) Keras on {backend}, 4 a GPU", f"not run: {part['not_run']}"))
            continue
        rows.append((
            f"(g) Keras on {backend}, 4 a GPU",
            f"{part['n_complete']} complete, {part['n_pruned']} pruned; peak "
            f"{_mib(part['peak_max_bytes'])} of {_mib(part['budget_min_bytes'])}",
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
