"""Cutting a host's GPUs into trial slots: the `GpuShare` each slot gives its trials.

A worker that owns GPUs (`trialq worker --gpus`) groups them `gpus_per_trial` at a time and
runs `trials_per_gpu` trials on each group at once, so it has `len(gpus) / gpus_per_trial *
trials_per_gpu` slots. Each trial's budget on each of its GPUs is `--gpu-memory-mb` where
given, else the card shared evenly after every trial's CUDA context is set aside (a context
takes memory no framework cap counts). Where the worker measured its GPUs when it started
(`trialq.gpu.context_probe`), the card is what CUDA lets its processes have, and the
context the measured one where it is larger than assumed; elsewhere a context is assumed
(`context_reserve_mb`) and the card is NVML's total. A worker that is an MPS client with a
pinned memory limit plans within the limit, not the card (`trialq.gpu.mps`), and each of its
trials gets a pinned limit of its own: its budget plus one context.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trialq.errors import UsageError
from trialq.gpu.attribution import ProcessView
from trialq.gpu.context_probe import ContextMeasure
from trialq.gpu.inventory import Gpu
from trialq.gpu.mps import limited, pinned_limits
from trialq.gpu.share import GpuShare

MIB = 2**20

CONTEXT_RESERVE_MB = 768
"""What one trial process holds beside its framework's capped allocations, where the worker did
not measure it: a CUDA context with a framework's libraries (measured on an H100, driver 580,
2026-11-27: PyTorch 621 MiB, JAX 561 MiB; benchmarks/README.md "GPU figures")."""

FRAMEWORK_LIBRARIES_MB = 256
"""What a framework's own libraries and kernels (cuBLAS, cuDNN, XLA's) add to the bare context
the worker's probe measures: on that H100, PyTorch +95 MiB and JAX +35 MiB after their first
operations, more as kernels load lazily. Without it the guard (budget plus context) killed a
JAX trial held by its own cap (2586 MiB against 2048 + 526)."""


@dataclass(frozen=True)
class GpuPlan:
    """How a worker cuts its GPUs: what `trialq worker` was asked for."""

    trials_per_gpu: int = 1
    gpus_per_trial: int = 1
    gpu_memory_mb: int = 0
    """Each trial's budget on each of its GPUs; 0: the card shared evenly."""
    context_reserve_mb: int = CONTEXT_RESERVE_MB
    mps_pinned_limits: str | None = None
    """`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` where the worker has it (`0=4G`): each GPU's memory
    is then no more than its limit."""
    interposer: bool = False
    """The allocation interposer is preloaded in the worker (`trialq.gpu.interposer`): where
    no MPS daemon serves the GPUs, each trial's budget is its limit."""
    mps_served: bool = False
    """An MPS daemon serves the worker's GPUs (its pinned limit is set, or its pipe directory
    is: `trialq.gpu.mps.served`): each trial gets its own pinned limit, its budget plus one
    context, which the driver enforces on every allocation of the trial's process."""

    def shares(
        self, gpus: tuple[Gpu, ...], measures: Mapping[str, ContextMeasure] | None = None
    ) -> tuple[GpuShare, ...]:
        """One share per slot: for each group of GPUs, `trials_per_gpu` of them; `measures`:
        the GPUs the worker measured, by id."""
        if not gpus:
            raise UsageError("--gpus: NVML found no such GPU on this host")
        if len(gpus) % self.gpus_per_trial:
            raise UsageError(
                f"--gpus-per-trial {self.gpus_per_trial}: {len(gpus)} GPUs do not split into "
                f"groups of {self.gpus_per_trial}"
            )
        gpus = limited(gpus, self.mps_pinned_limits)
        groups = [
            gpus[i : i + self.gpus_per_trial] for i in range(0, len(gpus), self.gpus_per_trial)
        ]
        known = measures or {}
        return tuple(
            self._share(group, known) for group in groups for _ in range(self.trials_per_gpu)
        )

    def _share(self, group: tuple[Gpu, ...], measures: Mapping[str, ContextMeasure]) -> GpuShare:
        """A slot's share; measured only where every GPU of its group was. The probe makes a
        bare driver context, and a framework's (its kernels, cuBLAS, cuDNN) is larger: the
        measure plus `FRAMEWORK_LIBRARIES_MB`, never below the assumed reserve."""
        total = min(gpu.total_bytes for gpu in group)
        found = [measures[gpu.id] for gpu in group if gpu.id in measures]
        floor = self.context_reserve_mb * MIB
        libraries = FRAMEWORK_LIBRARIES_MB * MIB
        context = (
            max(floor, *(m.context_bytes + libraries for m in found))
            if len(found) == len(group)
            else None
        )
        if context is not None:
            # CUDA's own total: what a framework's fraction is of (JAX's), and under MPS the
            # limit the daemon set, which the environment need not say; MPS's pinned limit
            # (already in `total`) bounds what CUDA measured as usable.
            total = min(total, *(m.total_bytes for m in found))
        usable = min(total, *(m.usable_bytes for m in found)) if context is not None else total
        budget = self.budget_bytes(group[0].id, usable, context)
        reserve = self.context_reserve_mb * MIB if context is None else context
        served = self.mps_served or bool(pinned_limits(self.mps_pinned_limits))
        return GpuShare(
            devices=tuple(gpu.id for gpu in group),
            budget_bytes=budget,
            model=group[0].model,
            total_bytes=total,
            mps_limit_bytes=(budget + reserve) // MIB * MIB if served else None,
            context_bytes=context,
            interposed=self.interposer and not served,
        )

    def budget_bytes(self, gpu_id: str, total_bytes: int, context_bytes: int | None = None) -> int:
        """One trial's budget on a GPU of `total_bytes` (usable, where measured) beside a
        context of `context_bytes` (measured; else the assumed reserve); refused where it
        cannot fit."""
        reserve = self.context_reserve_mb * MIB if context_bytes is None else context_bytes
        room = total_bytes - self.trials_per_gpu * reserve
        budget = self.gpu_memory_mb * MIB if self.gpu_memory_mb else room // self.trials_per_gpu
        if budget <= 0 or budget * self.trials_per_gpu > room:
            raise UsageError(
                f"GPU {gpu_id} ({total_bytes // MIB} MiB) cannot hold {self.trials_per_gpu} "
                f"trials of {budget // MIB} MiB each beside their CUDA contexts "
                f"({reserve // MIB} MiB each, {'assumed' if context_bytes is None else 'measured'})"
            )
        return budget


def held_by(shares: tuple[GpuShare, ...], view: ProcessView | None) -> str:
    """What holds the trials' budgets on this worker, in the words of its ready line: where
    memory is taken (MPS's pinned limits, the interposer, or only the frameworks' caps), and
    whether the guard can back them (it kills only where NVML names the trials' processes)."""
    if any(share.mps_limit_bytes is not None for share in shares):
        taken = "MPS's pinned limit per trial"
    elif any(share.interposed for share in shares):
        taken = "the allocation interposer per trial"
    else:
        taken = "the frameworks' caps only (no MPS daemon, no interposer)"
    guard = view in (ProcessView.PIDS, ProcessView.UNKNOWN)
    backstop = "the guard's backstop" if guard else "no guard kill (NVML names no trial's memory)"
    return f"budgets held by {taken}, with {backstop}"
