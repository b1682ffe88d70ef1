"""(f) and (g) of `python -m benchmarks.gpu`: two workers on one GPU, and Keras on a GPU
without TensorFlow.

(f) Two workers of one trial a GPU each on the same GPU and the same queue, as time-slicing
gives pods: started from this shell, then each in a PID namespace of its own (`unshare
--pid --fork --mount-proc`, as two containers see each other). What each worker's start
found on the device (its ready line: NVML's process list and the memory it saw in use),
the budget each trial was given, its peak, how it ended, and NVML's highest reading.

(g) The digits example's Keras model (`trialq.examples.digits.build_model`) at 4 a GPU on
Keras 3's `torch` and `jax` backends (`KERAS_BACKEND`), the framework named in the spec,
fitted with `trialq.keras.TrialCallback` under Optuna's median pruner: held to its budget,
pruned through the callback.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Callable
from typing import Any

from benchmarks.gpu_cluster import GpuWorker, NvmlSampler, StudyShape, run_study
from benchmarks.gpu_packing import trial_facts
from benchmarks.gpu_plan import Deadline

UNSHARE = ("unshare", "--pid", "--fork", "--mount-proc")
SHARED_ENTRY = "mid"
SHARED_SPACE: dict[str, tuple[float, float]] = {"width": (1024, 8192)}
KERAS_SPACE: dict[str, tuple[float, float]] = {"learning_rate": (1e-4, 3e-2)}
KERAS_BACKENDS = ("torch", "jax")
PART_NEEDS_S = 45.0
TORCH_PRELOADED = {"TRIALQ_PRELOAD": "torch,torch._dynamo"}
KEPT_ATTRS = ("outcome", "gpu_budget_bytes", "gpu_peaks_bytes", "duration_s", "worker", "host")


def shared_gpu(
    trials: int, deadline: Deadline, on_part: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """(f): both starts, each as it ends handed to `on_part`."""
    found: dict[str, Any] = {}
    for label, wrap in (("same_shell", ()), ("pid_namespaces", UNSHARE)):
        why_not = _cannot_wrap(wrap)
        if why_not or not deadline.allows(PART_NEEDS_S):
            found[label] = {"not_run": why_not or "the call's time ran out"}
        else:
            found[label] = _two_workers(trials, wrap)
        on_part(found)
    return found


def _cannot_wrap(wrap: tuple[str, ...]) -> str | None:
    if not wrap:
        return None
    if shutil.which(wrap[0]) is None:
        return f"no {wrap[0]} on this machine"
    if os.geteuid() != 0:
        return "a PID namespace needs root here"
    return None


def _two_workers(trials: int, wrap: tuple[str, ...]) -> dict[str, Any]:
    first = GpuWorker(1, TORCH_PRELOADED, wrap=wrap)
    second = GpuWorker(1, TORCH_PRELOADED, beside=first, wrap=wrap)
    with first, second, NvmlSampler() as sampler:
        result = run_study(first, SHARED_ENTRY, trials, SHARED_SPACE, StudyShape(in_flight=2))
        ready = [_ready_lines(worker) for worker in (first, second)]
    attrs = [t["user_attrs"] for t in sorted(result["trials"], key=lambda t: t["number"])]
    return {
        "wrap": list(wrap), "ready_lines": ready, **trial_facts(attrs),
        "per_trial": [{k: a[k] for k in KEPT_ATTRS if k in a} for a in attrs],
        "device_used_max_bytes": sampler.max_used, "device_total_bytes": sampler.total,
        "device_never_at_total": sampler.never_over(), "wall_s": round(result["wall_s"], 3),
    }  # fmt: skip


def _ready_lines(worker: GpuWorker) -> list[str]:
    log = worker.folder / "worker.log"
    text = log.read_text(encoding="utf-8", errors="replace") if log.exists() else ""
    return [line.strip()[-400:] for line in text.splitlines() if " ready: " in line]


def keras_on_gpu(
    trials: int, deadline: Deadline, on_part: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """(g): each backend's study at 4 a GPU (at least 16 trials: four waves, the first
    four trials unpruned, then the median pruner's verdicts through the callback), each as it
    ends handed to `on_part`."""
    trials = max(trials, 16)
    found: dict[str, Any] = {}
    for backend in KERAS_BACKENDS:
        missing = [m for m in ("keras", backend) if importlib.util.find_spec(m) is None]
        if missing or not deadline.allows(PART_NEEDS_S):
            why = f"not importable: {', '.join(missing)}" if missing else "the call's time ran out"
            found[backend] = {"not_run": why}
        else:
            found[backend] = keras_study(backend, trials)
        on_part(found)
    return found


def keras_shape(backend: str) -> StudyShape:
    """The Keras study names its framework: `auto` reads `trialq.keras` as TensorFlow's."""
    return StudyShape(framework=backend, pruner="median", pruner_startup=4)


def keras_study(backend: str, trials: int) -> dict[str, Any]:
    shape = keras_shape(backend)
    with GpuWorker(4, {"KERAS_BACKEND": backend}) as worker, NvmlSampler() as sampler:
        result = run_study(worker, "keras_digits", trials, KERAS_SPACE, shape)
    attrs = [t["user_attrs"] for t in result["trials"]]
    return {
        "per_gpu": 4, "n_complete": result["n_complete"], "n_pruned": result["n_pruned"],
        **trial_facts(attrs), "wall_s": round(result["wall_s"], 3),
        "device_used_max_bytes": sampler.max_used, "device_never_at_total": sampler.never_over(),
    }  # fmt: skip
