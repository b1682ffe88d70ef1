"""trialq on a real GPU: packing, memory, two workers on one GPU, Keras, an overrun, CUDA
contexts and start costs, measured so a figure survives a second look.

    python -m benchmarks.gpu [--quick] [--sections w,b,a,f,g,c,d,e] [--out PATH]
                             [--models small,mid,resnet] [--packings 1,4,8] [--repeats 3]
                             [--memory-trials N] [--deadline-s S]

Needs an NVIDIA GPU (nvidia-smi and NVML), PyTorch with CUDA; JAX, torchvision and Keras 3
for their parts. Without a GPU it prints one line and exits 2, writing nothing: no figure here
is ever made up. With one, it drives real `trialq worker --gpus all --trials-per-gpu N`
processes (an embedded Redis, `submit-study`'s driver in this process) and measures:

(w) a warm-up study, discarded: the first CUDA, cuDNN and page-cache loads fall on no figure;
(b) trials per hour per GPU at each packing, packings interleaved and repeated (1,4,8,8,4,1,
    1,4,8 at three repeats), at least 16 trials a run and three full waves at 8 a GPU; for the
    digits CNN, a mid-sized MLP and a torchvision ResNet-18 in bf16 (benchmarks/gpu_packing.py):
    medians with their spread, every peak against its budget, NVML every 50 ms, every note;
(a) GPU memory in use as each of N PyTorch trials of varying size starts: Optuna's
    `study.optimize` in one process, without and with `torch.cuda.empty_cache()` between
    trials (PyTorch's allocated and reserved bytes after each: growth apart from caching),
    against trialq;
(f) two workers of one trial a GPU on one GPU, from one shell and from separate PID
    namespaces; (g) Keras 3 on the torch and jax backends at 4 a GPU (benchmarks/gpu_sharing.py);
(c) one trial allocating twice its budget beside three well-behaved ones;
(d) the CUDA context's cost per framework (PyTorch, JAX), and JAX's cap holding;
(e) a trial's start cost with PyTorch preloaded and without.

The record (`--out`, default benchmarks/last_gpu.json) holds the machine, the date, the
versions, trialq's fix values (`fixes`) and every figure; it is written whole before the first
section and again as each section or run ends, so a call cut at its limit keeps what it
measured (`sections_done`, `not_run`; `complete` once all asked for ran). `--deadline-s`
bounds the whole: a run not started in time is listed in `not_run`. The command for a lent
machine is benchmarks/gpu_machine.sh.
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

from benchmarks import gpu_packing, gpu_report, gpu_sharing
from benchmarks.gpu_cluster import GpuWorker, run_study
from benchmarks.gpu_plan import Deadline

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "last_gpu.json"
NO_GPU = (
    "benchmarks.gpu: no NVIDIA GPU on this machine (nvidia-smi found none); "
    "nothing measured, nothing written"
)
SECTIONS = ("w", "b", "a", "f", "g", "c", "d", "e")
MODELS = gpu_packing.MODELS
JAX_NO_PREALLOCATION = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
"""JAX takes 75 % of the card at its first op unless told not to: its context alone is asked."""
FRAMEWORK_PACKAGES = (
    "torch", "torchvision", "jax", "jaxlib", "keras", "lightning", "optuna", "celery", "trialq",
)  # fmt: skip
TORCH_PRELOADED = {"TRIALQ_PRELOAD": "torch,torch._dynamo"}
"""(a) and (b) measure memory and packing, not PyTorch's import (8-12 s a trial on the first
lent VM, which drowned both): their workers preload it, as docs/frameworks.md advises."""
DEADLINE_S = 480.0


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


def fixes() -> dict[str, Any]:
    """The values trialq's GPU fixes set, read from trialq itself: the PyTorch fraction's
    headroom below the budget (a 20 MiB page and a 2 MiB one) and the allowance for a
    framework's libraries beside the measured CUDA context. The peaks after them are each
    run's `peak_max_bytes` against `budget_min_bytes`."""
    found: dict[str, Any] = {}
    for name, module, attribute in (
        ("pytorch_page_headroom_bytes", "trialq.trial.frameworks.pytorch", "PAGE_HEADROOM_BYTES"),
        ("framework_libraries_mb", "trialq.gpu.plan", "FRAMEWORK_LIBRARIES_MB"),
    ):
        try:
            found[name] = getattr(__import__(module, fromlist=[attribute]), attribute)
        except (ImportError, AttributeError):
            found[name] = None  # moved or renamed: said as unknown, never guessed
    return found


IN_PROCESS = """
import gc, json, sys, optuna, torch
from benchmarks import gpu_trials as g
empty_cache = sys.argv[2] == "1"
used, allocated, reserved = [], [], []
def objective(t):
    m = g.mid({"width": t.suggest_int("width", 1024, 8192, step=512)}, g.NoTrial())
    gc.collect()
    if empty_cache:
        torch.cuda.empty_cache()
    allocated.append(torch.cuda.memory_allocated()); reserved.append(torch.cuda.memory_reserved())
    used.append(int(m["device_used_at_start_bytes"])); return m["loss"]
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.create_study(sampler=optuna.samplers.RandomSampler(0))
study.optimize(objective, int(sys.argv[1]))
print(json.dumps({"used_at_start": used, "allocated_after": allocated, "reserved_after": reserved}))
"""
"""(a)'s loop in one process: after each trial, PyTorch's live tensors (`allocated`, what a
leak grows) and its reserved bytes (`reserved`, live plus the cache of freed blocks)."""


def memory_over_trials(
    trials: int, on_part: Callable[[dict[str, Any]], None] = lambda part: None
) -> dict[str, Any]:
    """(a): the device's memory in use as each trial starts, in one process without and
    with `empty_cache` between trials, then in trialq; each half handed to `on_part` as it
    ends (it saves it)."""
    found: dict[str, Any] = {}
    for label, empty in (("in_process", "0"), ("in_process_empty_cache", "1")):
        done = subprocess.run(
            [sys.executable, "-c", IN_PROCESS, str(trials), empty],
            capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"the in-process loop failed: {done.stderr[-2000:]}")
        found[label] = json.loads(done.stdout.strip().splitlines()[-1])
        found[label]["growth_bytes"] = (
            found[label]["used_at_start"][-1] - found[label]["used_at_start"][0]
        )
        on_part(found)
    with GpuWorker(per_gpu=1, env=TORCH_PRELOADED) as worker:
        summary = run_study(worker, "mid", trials, {"width": (1024, 8192)})
    ordered = sorted(summary["trials"], key=lambda t: t["number"])
    found["trialq"] = [
        int(t["user_attrs"]["metrics"].get("device_used_at_start_bytes", -1)) for t in ordered
    ]
    return found


def overrun() -> dict[str, Any]:
    """(c): trial 0 allocates twice its budget; trials 1-3 train beside it."""
    with GpuWorker(per_gpu=4) as worker:
        summary = run_study(worker, "hog_or_train", 4, {"seconds": (20, 21)})
    by_number = {t["number"]: t["user_attrs"] for t in summary["trials"]}
    return {
        "hog_attrs": {k: v for k, v in by_number[0].items() if k != "metrics"},
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
    args = parser().parse_args(argv)
    # a step cut at its time limit (SIGTERM) ends its worker and trials on the way out
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    found = gpus()
    if not found:
        print(NO_GPU, file=sys.stderr)
        return 2
    out = args.out or OUT
    choices = Choices(args.packings, args.models, args.memory_trials, args.repeats)
    record = gpu_report.Record(head(found, args.quick, choices), out)
    measure(record, args.quick, args.sections, choices, Deadline(args.deadline_s))
    print(gpu_report.table(record.data))
    print(f"written: {out}")
    return 0


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    made.add_argument("--quick", action="store_true", help="fewer trials: a smoke run")
    made.add_argument(
        "--sections", type=_sections, default=SECTIONS, help=f"some of {','.join(SECTIONS)}"
    )
    made.add_argument("--out", type=Path, default=None, help=f"default {OUT}")
    made.add_argument(
        "--packings", type=_packings, default=None,
        help="(b)'s trials a GPU for every model (default small 1,4,8; mid and resnet 1,4)",
    )  # fmt: skip
    made.add_argument(
        "--models", type=_models, default=MODELS, help=f"(b)'s models, of {','.join(MODELS)}"
    )
    made.add_argument("--repeats", type=_positive, default=3, help="(b)'s runs a packing")
    made.add_argument(
        "--memory-trials", type=_positive, default=None, help="(a)'s trials (default 30, quick 8)"
    )
    made.add_argument(
        "--deadline-s", type=_positive, default=DEADLINE_S,
        help=f"no run starts after this many seconds (default {DEADLINE_S:.0f})",
    )  # fmt: skip
    return made


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"a whole number of 1 or more, not {text!r}")
    return value


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

    packings: tuple[int, ...] | None = None
    models: tuple[str, ...] = MODELS
    memory_trials: int | None = None
    repeats: int = 3


def workloads() -> dict[str, str]:
    """What each benchmark trial does, as its sizes stand in this call."""
    from benchmarks import gpu_trials as t

    return {
        "small": f"the digits CNN (trialq.examples.torch_digits), {t.SMALL_EPOCHS} epochs",
        "mid": "an MLP of width 1024-4096 ((a): 1024-8192), 60 steps of 4096 x 1024",
        "resnet": f"torchvision ResNet-18, weights=None, {t.RESNET_STEPS} steps of "
        f"{t.RESNET_BATCH} synthetic 224 x 224 images, bf16 autocast, cudnn.benchmark",
        "keras_digits": f"the digits example's Keras model, {t.KERAS_EPOCHS} epochs",
    }


def head(found: list[dict[str, Any]], quick: bool, choices: Choices) -> dict[str, Any]:
    """What the record says before any figure: the machine, date, versions, fix values."""
    return {
        "date": datetime.date.today().isoformat(),
        "device": {**found[0], "count": len(found)},
        "versions": versions(),
        "fixes": fixes(),
        "workloads": workloads(),
        "quick": quick,
        "choices": {
            "packings": None if choices.packings is None else list(choices.packings),
            "models": list(choices.models), "memory_trials": choices.memory_trials,
            "repeats": choices.repeats,
        },
    }  # fmt: skip


def measure(
    record: gpu_report.Record, quick: bool, sections: tuple[str, ...], choices: Choices,
    deadline: Deadline,
) -> None:  # fmt: skip
    """The sections asked for, in order; each saved as it ends (and (a), (b), (f) and (g) as
    each of their parts ends). A section the deadline leaves no time for is listed as not run."""
    memory_trials = choices.memory_trials or (8 if quick else 30)
    trials = 8 if quick else 16

    def keeper(key: str) -> Callable[[Any], None]:
        return lambda part: record.put(key, part)

    steps: dict[str, tuple[str, Callable[[], Any]]] = {
        "w": ("warmup", lambda: warm_up()),
        "b": ("throughput", lambda: gpu_packing.throughput(
            choices.models, choices.repeats, deadline, keeper("throughput"), choices.packings)),
        "a": ("memory_over_trials", lambda: memory_over_trials(
            memory_trials, keeper("memory_over_trials"))),
        "f": ("shared_gpu", lambda: gpu_sharing.shared_gpu(
            trials, deadline, keeper("shared_gpu"))),
        "g": ("keras", lambda: gpu_sharing.keras_on_gpu(trials, deadline, keeper("keras"))),
        "c": ("overrun", overrun),
        "d": ("contexts", contexts),
        "e": ("start_cost", lambda: start_cost(4 if quick else 16)),
    }  # fmt: skip
    for section in sections:
        key, run = steps[section]
        if not deadline.allows(30.0):
            record.not_run(key, "the call's time ran out")
            continue
        record.put(key, run())
        record.done(section)
    record.put("complete", True)


def warm_up() -> dict[str, Any]:
    """(w): one study of the small model, its figures discarded: what a first run on a cold
    machine pays (CUDA's and cuDNN's modules, the page cache) falls on no figure."""
    with GpuWorker(per_gpu=1, env=TORCH_PRELOADED) as worker:
        summary = run_study(worker, "small", 4, {"learning_rate": (1e-4, 1e-2)})
    return {"discarded": True, "trials": 4, "wall_s": round(summary["wall_s"], 3)}


if __name__ == "__main__":
    raise SystemExit(main())
