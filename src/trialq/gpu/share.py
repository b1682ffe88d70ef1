"""`GpuShare`: the GPUs one trial process gets, and how much memory of each it may use.

The contract between the worker, which owns a host's GPUs and cuts them into trial slots
(`trialq.worker.slots`), and the framework adapters (`trialq.trial.frameworks`), which turn a
share into each framework's settings before its import and its cap after it. A share is
decided in the worker's parent and handed to the trial process, which sets
`CUDA_VISIBLE_DEVICES` from it before anything imports CUDA.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from trialq.gpu.interposer import LIMIT, trial_environment
from trialq.gpu.mps import PINNED_LIMIT, limit_text, pinned_limits

VISIBLE = "CUDA_VISIBLE_DEVICES"
BUDGET = "TRIALQ_GPU_BUDGET_BYTES"
MODEL = "TRIALQ_GPU_MODEL"
TOTAL = "TRIALQ_GPU_TOTAL_BYTES"
CONTEXT = "TRIALQ_GPU_CONTEXT_BYTES"


@dataclass(frozen=True)
class GpuShare:
    """A trial process's GPUs (indices, `GPU-<uuid>` or `MIG-<uuid>`, as CUDA names them)
    and its memory budget on each."""

    devices: tuple[str, ...]
    budget_bytes: int | None = None
    """What the trial may use on each of its GPUs; None: the whole device, no cap."""
    model: str | None = None
    """The GPUs' model as NVML names it (`NVIDIA H100 80GB HBM3`), where known."""
    total_bytes: int | None = None
    """Each GPU's memory as NVML counts it (or MPS's pinned limit, lower), where known."""
    mps_limit_bytes: int | None = None
    """MPS's pinned limit on each of the GPUs, where the worker is an MPS client with one
    (`trialq.gpu.mps`): carried as `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` counted from the
    trial's own first device, since its ordinals are not the worker's."""
    context_bytes: int | None = None
    """One process's CUDA context on these GPUs, as the worker measured it when it started
    (`trialq.gpu.context_probe`); None: not measured (a context is then assumed)."""
    interposed: bool = False
    """The worker has the allocation interposer preloaded and no MPS daemon serves its GPUs:
    the trial's environment carries its budget as the interposer's limit
    (`trialq.gpu.interposer`)."""

    @property
    def visible(self) -> str:
        """The value of `CUDA_VISIBLE_DEVICES` for the trial process."""
        return ",".join(self.devices)

    def environment(self) -> dict[str, str]:
        """The variables that carry the share into the trial process (before any import),
        called in that process (the interposer's cache file is its own)."""
        env = {VISIBLE: self.visible}
        sizes = ((BUDGET, self.budget_bytes), (TOTAL, self.total_bytes))
        for name, value in (*sizes, (CONTEXT, self.context_bytes)):
            if value is not None:
                env[name] = str(value)
        if self.model:
            env[MODEL] = self.model
        if self.mps_limit_bytes is not None:
            env[PINNED_LIMIT] = limit_text(self.mps_limit_bytes, len(self.devices))
        if self.interposed and self.budget_bytes is not None:
            env.update(trial_environment(self.budget_bytes, len(self.devices), os.getpid()))
        return env

    @classmethod
    def from_environment(cls, env: Mapping[str, str]) -> GpuShare | None:
        """The share the environment carries; None without `CUDA_VISIBLE_DEVICES` or with it
        empty (no GPU for this process)."""
        visible = env.get(VISIBLE, "").strip()
        if not visible or visible == "-1":
            return None
        devices = tuple(part.strip() for part in visible.split(",") if part.strip())
        return cls(
            devices,
            _int(env.get(BUDGET)),
            env.get(MODEL) or None,
            _int(env.get(TOTAL)),
            mps_limit_bytes=min(pinned_limits(env.get(PINNED_LIMIT)).values(), default=None),
            context_bytes=_int(env.get(CONTEXT)),
            interposed=f"{LIMIT}_0" in env,
        )


def _int(text: str | None) -> int | None:
    return int(text) if text else None
