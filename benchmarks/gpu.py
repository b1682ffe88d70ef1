"""trialq on a real GPU: memory, packing, an overrun, CUDA contexts and start costs.

    python -m benchmarks.gpu [--quick] [--sections a,b,c,d,e] [--out PATH]

Needs an NVIDIA GPU (nvidia-smi and NVML), PyTorch with CUDA, and JAX with CUDA for (d)'s
JAX figures. Without a GPU it prints one line and exits 2, writing nothing: no figure here is
ever made up. With one, it drives real `trialq worker --gpus all --trials-per-gpu N`
processes (an embedded Redis, `submit-study`'s driver in this process) and measures:

(a) GPU memory in use after each of 30 PyTorch trials of varying size: Optuna's
    `study.optimize` in one process against trialq (what each trial finds at its start);
(b) trials per hour at 1, 2, 4 and 8 trials per GPU, for a small model (digits) and a
    mid-sized one; every trial's peak within its budget; the device never over its memory
    (NVML sampled every 50 ms);
(c) one trial allocating twice its budget beside three well-behaved ones: it ends `oom`,
    the three complete;
(d) the CUDA context's cost per framework (PyTorch, JAX), and JAX's cap holding;
(e) a trial's start cost with its framework preloaded (`TRIALQ_PRELOAD=torch,torch._dynamo`)
    and without (`none`).

Writes benchmarks/last_gpu.json (or `--out`: device, date, driver and versions, every
figure) as each section ends, and each of (b)'s runs as it ends, so a run cut at its time limit
keeps what it measured (`"sections_done"` says which; `"complete"` is true once all asked for
have run). Then prints the table for the README's "GPU figures". `--sections` runs some of
them (a lent GPU machine runs them in two calls: benchmarks/gpu_machine.sh).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks import gpu_report
from benchmarks.gpu_cluster import GpuWorker, NvmlSampler, run_study

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "last_gpu.json"
NO_GPU = (
    "benchmarks.gpu: no NVIDIA GPU on this machine (nvidia-smi found none); "
    "nothing measured, nothing written"
)
PACKINGS = (1, 2, 4, 8)
MODEL_SPACES: dict[str, dict[str, tuple[float, float]]] = {
    "small": {"learning_rate": (1e-4, 1e-2)},
    "mid": {"width": (1024, 4096)},
}
MODELS = tuple(MODEL_SPACES)
SECTIONS = ("a", "b", "c", "d", "e")
JAX_NO_PREALLOCATION = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
"""JAX takes 75 % of the card at its first op unless told not to: its context alone is asked."""
FRAMEWORK_PACKAGES = ("torch", "jax", "jaxlib", "lightning", "optuna", "celery", "trialq")
TORCH_PRELOADED = {"TRIALQ_PRELOAD": "torch,torch._dynamo"}
"""(a) and (b) measure memory and packing, not PyTorch's import (8-12 s a trial on the first
lent VM, which drowned both): their workers preload it, as docs/frameworks.md advises."""


def gpus() -> list[dict[str, Any]]:
    """The GPUs nvidia-smi lists (name, driver, MiB); empty without a GPU or nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = "--query-gpu=name,driver_version,memory.total"
    done = subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True, text=True
    )
    if done.returncode != 0:
        return []
    rows = [line.split(", ") for line in done.stdout.strip().splitlines() if line.strip()]
    return [{"name": n, "driver": d, "memory_mib": int(float(m))} for n, d, m in rows]


def versions() -> dict[str, str | None]:
    """Installed versions of the frameworks and of trialq's own pieces (none imported)."""
    found: dict[str, str | None] = {}
    for package in FRAMEWORK_PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def memory_over_trials(
    trials: int, on_part: Callable[[dict[str, list[int]]], None] = lambda part: None
) -> dict[str, list[int]]:
    """(a): the device's memory in use as each trial starts, in one process and in trialq;
    `on_part` is handed the in-process half as soon as it is measured (it saves it), so a
    step cut during trialq's half keeps it."""
    script = (
        "import json, optuna\nfrom benchmarks import gpu_trials as g\n"
        "used = []\n"
        "def objective(t):\n"
        "    m = g.mid({'width': t.suggest_int('width', 1024, 8192, step=512)}, g.NoTrial())\n"
        "    used.append(int(m['device_used_at_start_bytes'])); return m['loss']\n"
        "optuna.logging.set_verbosity(optuna.logging.WARNING)\n"
        "study = optuna.create_study(sampler=optuna.samplers.RandomSampler(0))\n"
        f"study.optimize(objective, {trials})\n"
        "print(json.dumps(used))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"the in-process loop failed: {done.stderr[-2000:]}")
    in_process = [int(x) for x in json.loads(done.stdout.strip().splitlines()[-1])]
    on_part({"in_process": in_process})
    with GpuWorker(per_gpu=1, env=TORCH_PRELOADED) as worker:
        summary = run_study(worker, "mid", trials, {"width": (1024, 8192)})
    ordered = sorted(summary["trials"], key=lambda t: t["number"])
    at_start = [
        int(t["user_attrs"]["metrics"].get("device_used_at_start_bytes", -1)) for t in ordered
    ]
    return {"in_process": in_process, "trialq": at_start}


def throughput(
    trials: int,
    on_run: Callable[[list[dict[str, Any]]], None] = lambda runs: None,
    models: tuple[str, ...] = MODELS,
    packings: tuple[int, ...] = PACKINGS,
) -> list[dict[str, Any]]:
    """(b): trials per hour per GPU at each packing, for the small and the mid-sized model;
    `on_run` is handed the runs so far as each ends (it saves them)."""
    runs: list[dict[str, Any]] = []
    for model in models:
        space = MODEL_SPACES[model]
        for per_gpu in packings:
            with GpuWorker(per_gpu, TORCH_PRELOADED) as worker, NvmlSampler() as sampler:
                summary = run_study(worker, model, trials, space)
            runs.append(_throughput_run(model, per_gpu, summary, sampler, worker.gpu_count))
            on_run(runs)
    return runs


def _throughput_run(
    model: str, per_gpu: int, summary: dict[str, Any], sampler: NvmlSampler, gpu_count: int
) -> dict[str, Any]:
    attrs = [t["user_attrs"] for t in summary["trials"]]
    within = all(
        max(a.get("gpu_peaks_bytes") or [0]) <= (a.get("gpu_budget_bytes") or float("inf"))
        for a in attrs
    )
    finished = summary["n_complete"] + summary["n_pruned"]
    return {
        "model": model, "per_gpu": per_gpu, "trials": len(attrs), "finished": finished,
        "wall_s": round(summary["wall_s"], 3),
        "trials_per_hour_per_gpu": round(finished / summary["wall_s"] * 3600 / gpu_count, 1),
        "peaks_within_budget": within, "device_never_over": sampler.never_over(),
        "device_used_max_bytes": sampler.max_used, "outcomes": [a.get("outcome") for a in attrs],
    }  # fmt: skip


def overrun() -> dict[str, Any]:
    """(c): trial 0 allocates twice its budget; trials 1-3 train beside it."""
    with GpuWorker(per_gpu=4) as worker:
        summary = run_study(worker, "hog_or_train", 4, {"seconds": (20, 21)})
    by_number = {t["number"]: t["user_attrs"] for t in summary["trials"]}
    return {
        "hog": by_number[0].get("outcome"),
        "hog_caused_by_neighbour": by_number[0].get("oom_caused_by_neighbour"),
        "others": [by_number[n].get("outcome") for n in sorted(by_number) if n != 0],
    }


def contexts() -> dict[str, Any]:
    """(d): what creating a CUDA context costs each framework, and JAX held to its budget."""
    probes = {
        "torch": ("import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()", {}),
        "jax": ("import jax.numpy as j; j.zeros(1).block_until_ready()", JAX_NO_PREALLOCATION),
    }
    cost = {name: _context_cost(code, env) for name, (code, env) in probes.items()}
    with GpuWorker(per_gpu=4) as worker:
        summary = run_study(worker, "jax_over_budget", 1, {"x": (0, 1)})
    attrs = summary["trials"][0]["user_attrs"]
    peak = max(attrs.get("gpu_peaks_bytes") or [0]) or None
    budget = attrs.get("gpu_budget_bytes")
    held = (
        attrs.get("outcome") == "oom" and peak is not None and budget is not None and peak <= budget
    )
    return {"cost": cost, "jax_cap": {"held": held, "peak": peak, "budget": budget, "attrs": attrs}}


def _context_cost(code: str, env: dict[str, str]) -> int | None:
    """The device's memory in use while a fresh process holds only a context, less before."""
    from benchmarks.gpu_trials import device_used_bytes

    before = device_used_bytes()
    probe = (
        f"{code}\nfrom benchmarks.gpu_trials import device_used_bytes\nprint(device_used_bytes())"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
        env={**os.environ, **env},
    )  # fmt: skip
    if done.returncode != 0:
        return None  # the framework is missing or has no CUDA here: said as n/a
    return int(done.stdout.strip().splitlines()[-1]) - before


def start_cost(trials: int) -> dict[str, float]:
    """(e): the median duration of an all-start trial, preloaded and not."""
    medians = {}
    for label, preload in (
        ("torch preloaded", "torch,torch._dynamo"),
        ("nothing preloaded", "none"),
    ):
        with GpuWorker(per_gpu=1, env={"TRIALQ_PRELOAD": preload}) as worker:
            summary = run_study(worker, "tiny_torch", trials, {"x": (0, 1)})
        durations = [t["user_attrs"]["duration_s"] for t in summary["trials"]]
        medians[label] = round(statistics.median(durations), 4)
    return medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer trials: a smoke run")
    parser.add_argument(
        "--sections", type=_sections, default=SECTIONS, help="which of a,b,c,d,e (default all)"
    )
    parser.add_argument("--out", type=Path, default=None, help=f"default {OUT}")
    parser.add_argument(
        "--packings", type=_packings, default=PACKINGS, help="(b)'s trials per GPU, e.g. 1,4"
    )
    parser.add_argument(
        "--models", type=_models, default=MODELS, help=f"(b)'s models, of {','.join(MODELS)}"
    )
    parser.add_argument(
        "--memory-trials", type=int, default=None, help="(a)'s trials (default 30, quick 8)"
    )
    args = parser.parse_args(argv)
    # a step cut at its time limit (SIGTERM) ends its worker and trials on the way out
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    found = gpus()
    if not found:
        print(NO_GPU, file=sys.stderr)
        return 2
    out = args.out or OUT
    choices = Choices(args.packings, args.models, args.memory_trials)
    record = measure(
        found, args.quick, args.sections, lambda r: gpu_report.write_json(r, out), choices
    )
    print(gpu_report.table(record))
    print(f"written: {out}")
    return 0


def _sections(text: str) -> tuple[str, ...]:
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"sections are {','.join(SECTIONS)}, not {text!r}")
    return chosen


def _packings(text: str) -> tuple[int, ...]:
    try:
        chosen = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        chosen = ()
    if not chosen or any(n < 1 for n in chosen):
        raise argparse.ArgumentTypeError(f"packings are whole numbers of 1 or more, not {text!r}")
    return chosen


def _models(text: str) -> tuple[str, ...]:
    chosen = tuple(part.strip() for part in text.split(",") if part.strip())
    if not chosen or set(chosen) - set(MODELS):
        raise argparse.ArgumentTypeError(f"models are {','.join(MODELS)}, not {text!r}")
    return chosen


@dataclass(frozen=True)
class Choices:
    """What a run measures within its sections: a lent machine's short lease picks fewer."""

    packings: tuple[int, ...] = PACKINGS
    models: tuple[str, ...] = MODELS
    memory_trials: int | None = None


def measure(
    found: list[dict[str, Any]],
    quick: bool,
    sections: tuple[str, ...] = SECTIONS,
    save: Callable[[dict[str, Any]], None] = lambda record: None,
    choices: Choices = Choices(),
) -> dict[str, Any]:
    """The sections asked for, in order, on this machine's GPUs; the record is saved before
    the first, after each section and after each of (b)'s runs."""
    record: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "device": {**found[0], "count": len(found)},
        "versions": versions(),
        "quick": quick,
        "choices": {
            "packings": list(choices.packings),
            "models": list(choices.models),
            "memory_trials": choices.memory_trials,
        },
        "sections_done": [],
        "complete": False,
    }
    save(record)

    memory_trials = choices.memory_trials or (8 if quick else 30)

    def keep_runs(runs: list[dict[str, Any]]) -> None:
        save({**record, "throughput": runs})

    def keep_memory(part: dict[str, list[int]]) -> None:
        save({**record, "memory_over_trials": part})

    steps: dict[str, tuple[str, Callable[[], Any]]] = {
        "a": ("memory_over_trials", lambda: memory_over_trials(memory_trials, keep_memory)),
        "b": (
            "throughput",
            lambda: throughput(8 if quick else 32, keep_runs, choices.models, choices.packings),
        ),
        "c": ("overrun", overrun),
        "d": ("contexts", contexts),
        "e": ("start_cost", lambda: start_cost(4 if quick else 16)),
    }
    for section in sections:
        key, run = steps[section]
        record[key] = run()
        record["sections_done"].append(section)
        save(record)
    record["complete"] = True
    save(record)
    return record


if __name__ == "__main__":
    raise SystemExit(main())
