"""(b) of `python -m benchmarks.gpu`: trials per hour at each packing, repeated and
interleaved, for three workloads, summed up as medians with their spread.

One worker per workload with as many slots a GPU as the largest packing; a run's packing is
its study's `max_in_flight` (trials at once a GPU), so packings interleave without a
worker's start between them. Each trial's budget is therefore the largest packing's share,
the same in every run: the figures compare concurrency, not budgets. A run at 8 a GPU has 24
trials, three full waves.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from benchmarks.gpu_cluster import GpuWorker, NvmlSampler, StudyShape, run_study
from benchmarks.gpu_plan import Deadline, interleaved, ratios, spread, trials_for, waves

MODEL_SPACES: dict[str, dict[str, tuple[float, float]]] = {
    "small": {"learning_rate": (1e-4, 1e-2)},
    "mid": {"width": (1024, 4096)},
    "resnet": {"learning_rate": (0.01, 0.1)},
}
MODELS = tuple(MODEL_SPACES)
PACKINGS: dict[str, tuple[int, ...]] = {"small": (1, 4, 8), "mid": (1, 4), "resnet": (1, 4)}
PRELOAD: dict[str, str] = {
    "small": "torch,torch._dynamo",
    "mid": "torch,torch._dynamo",
    "resnet": "torch,torch._dynamo,torchvision",
}
"""The workers preload what their trials import (docs/frameworks.md): packing, not imports."""
RUN_NEEDS_S = 20.0
"""A run is not started with less of the call's time left than this."""


def throughput(
    models: tuple[str, ...], repeats: int, deadline: Deadline,
    on_part: Callable[[dict[str, Any]], None], packings: tuple[int, ...] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Every model's interleaved runs and their summary; `on_part` is handed the whole after
    each run (it saves it), so a cut call keeps every run that ended."""
    found: dict[str, Any] = {"not_run": []}
    for model in models:
        chosen = packings or PACKINGS[model]
        schedule = interleaved(chosen, repeats)
        runs: list[dict[str, Any]] = []
        env = {"TRIALQ_PRELOAD": PRELOAD[model]}
        with GpuWorker(max(chosen), env) as worker:
            for per_gpu in schedule:
                if not deadline.allows(RUN_NEEDS_S):
                    found["not_run"].append({"model": model, "per_gpu": per_gpu})
                    continue
                runs.append(packing_run(worker, model, per_gpu))
                found[model] = {"schedule": schedule, "slots_per_gpu": max(chosen),
                                "runs": runs, "summary": summary(runs)}  # fmt: skip
                on_part(found)
    return found


def packing_run(worker: GpuWorker, model: str, per_gpu: int) -> dict[str, Any]:
    """One study at `per_gpu` trials at once a GPU, NVML sampled beside it."""
    in_flight = per_gpu * worker.gpu_count
    trials = trials_for(in_flight)
    with NvmlSampler() as sampler:
        result = run_study(
            worker, model, trials, MODEL_SPACES[model], StudyShape(in_flight=in_flight)
        )
    finished = result["n_complete"] + result["n_pruned"]
    return {
        "per_gpu": per_gpu, "waves": waves(trials, in_flight), "wall_s": round(result["wall_s"], 3),
        "trials_per_hour_per_gpu": round(finished / result["wall_s"] * 3600 / worker.gpu_count, 1),
        **trial_facts([t["user_attrs"] for t in result["trials"]]),
        "device_used_max_bytes": sampler.max_used, "device_total_bytes": sampler.total,
        "device_never_at_total": sampler.never_over(),
    }  # fmt: skip


def trial_facts(attrs: list[dict[str, Any]]) -> dict[str, Any]:
    """What a run's trials say of themselves: outcomes, the highest peak against the smallest
    budget, and every note a trial carries (`*note*` keys), each named by its trial."""
    peaks = [max(a.get("gpu_peaks_bytes") or [0]) for a in attrs]
    budgets = [a["gpu_budget_bytes"] for a in attrs if a.get("gpu_budget_bytes")]
    notes = [
        {"trial": index, "key": key, "value": value}
        for index, a in enumerate(attrs)
        for key, value in sorted(a.items())
        if "note" in key and value
    ]
    within = all(
        peak <= (a.get("gpu_budget_bytes") or float("inf"))
        for peak, a in zip(peaks, attrs, strict=True)
    )
    return {
        "trials": len(attrs),
        "outcomes": dict(Counter(str(a.get("outcome")) for a in attrs)),
        "peak_max_bytes": max(peaks, default=0),
        "budget_min_bytes": min(budgets, default=None),
        "peaks_within_budget": within,
        "notes": notes,
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per packing: the median trials/h with its spread; the ratios of the medians to one a
    GPU; and whether every run held (all `ok`, within budget, device never at its total)."""
    packings = sorted({run["per_gpu"] for run in runs})
    per_packing = {
        str(p): spread([r["trials_per_hour_per_gpu"] for r in runs if r["per_gpu"] == p])
        for p in packings
    }
    medians = {p: per_packing[str(p)]["median"] for p in packings}
    return {
        "trials_per_hour_per_gpu": per_packing,
        "ratio_of_medians": ratios(medians),
        "all_ok": all(set(r["outcomes"]) == {"ok"} for r in runs),
        "all_within_budget": all(r["peaks_within_budget"] for r in runs),
        "device_never_at_total": all(r["device_never_at_total"] for r in runs),
        "notes": sum(len(r["notes"]) for r in runs),
        "fewest_waves_at_most_packed": min(
            (r["waves"] for r in runs if r["per_gpu"] == packings[-1]), default=0
        ),
    }
