"""An attempt on GPUs it shares with its neighbours (`trialq worker --gpus`): refused where
a stranger holds them (`NeighbourCheck`; the one refusal of a device that is not clean,
`TrialResult.device_refused_here`), else run under the GPU memory guard (`GpuGuard`), its
own OOM told apart from one its neighbours caused.

It runs in the trial's own process, around `run_trial`, before anything imports CUDA:
NVML reads the GPUs without a CUDA context.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from trialq.trial.gpu_guard import GpuGuard, GpuOverrun
from trialq.trial.gpu_inventory import Nvml
from trialq.trial.gpu_share import GpuShare
from trialq.trial.telemetry import MIB, NeighbourCheck
from trialq.wire.messages import Outcome, TrialRequest, TrialResult

logger = logging.getLogger("trialq.worker")  # the name log lines show; kept when the code moved


@dataclass(frozen=True)
class GpuLimits:
    """What the worker's settings say of a trial's GPUs: the NVML binding, the memory a
    stranger may hold before a GPU counts as not clean, and one CUDA context's reserve
    (where the worker did not measure it: `GpuShare.context_bytes`)."""

    nvml_module: str
    tolerance_mb: int
    context_reserve_mb: int


def run_on_share(
    request: TrialRequest,
    share: GpuShare | None,
    limits: GpuLimits,
    run: Callable[[], TrialResult],
    leave: Callable[[TrialResult], None],
) -> TrialResult:
    """`run()` on the slot's GPUs, guarded; `leave` stores the guard's `oom` before it kills
    the trial's process. Without a share (or NVML), `run()` as it is."""
    nvml = Nvml.open(limits.nvml_module) if share is not None else None
    if nvml is None or share is None:
        return run()
    with nvml:
        refusal = NeighbourCheck(limits.tolerance_mb * MIB).refusal(nvml, share)
        if refusal is not None:
            logger.critical("%s", refusal)
            return TrialResult.device_refused_here(request, refusal)
        measured = share.context_bytes
        reserve = measured if measured is not None else limits.context_reserve_mb * MIB
        with GpuGuard(nvml, share, reserve, _leave_oom(request, leave)) as guard:
            result = run()
        neighbours = result.outcome is Outcome.OOM and guard.neighbour_caused()
        return result.with_gpu_guard(guard.peaks(), neighbours)


def _leave_oom(
    request: TrialRequest, leave: Callable[[TrialResult], None]
) -> Callable[[GpuOverrun], None]:
    """What the GPU memory guard does before it kills the trial's process: leave its result,
    `oom` (once: the trial's memory grows while Redis is waited for)."""

    def on_overrun(overrun: GpuOverrun) -> None:
        logger.error("%s", overrun.text())
        peaks = {overrun.device: overrun.used_bytes}
        leave(TrialResult.here(request, Outcome.OOM, overrun.text(), gpu_process_peak_bytes=peaks))

    return on_overrun
