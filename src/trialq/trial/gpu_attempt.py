"""An attempt on GPUs it shares with its neighbours (`trialq worker --gpus`): refused where
a stranger holds them (`NeighbourCheck`; the one refusal of a device that is not clean,
`TrialResult.device_refused_here`), else run under the GPU memory guard (`GpuGuard`), its
own OOM told apart from one its neighbours caused. Both follow what NVML's process list can
be trusted for on this host (`ProcessView`, found at the worker's start), and what they could
not attribute or read is said on the result, never a failure (docs/oom.md).

It runs in the trial's own process, around `run_trial`, before anything imports CUDA:
NVML reads the GPUs without a CUDA context.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trialq.gpu.attribution import ProcessView, Source
from trialq.gpu.inventory import Nvml
from trialq.gpu.once_per_worker import OncePerWorker
from trialq.gpu.share import GpuShare
from trialq.gpu.telemetry import MIB, NeighbourCheck, StartCheck, TrialMarks
from trialq.trial.gpu_guard import GpuGuard, GpuOverrun
from trialq.wire.messages import (
    GpuGuardFigures,
    Measurements,
    Outcome,
    TrialRequest,
    TrialResult,
)

logger = logging.getLogger("trialq.worker")  # the name log lines show; kept when the code moved


@dataclass(frozen=True)
class GpuLimits:
    """What the worker's settings say of a trial's GPUs: the NVML binding, the memory a
    stranger may hold before a GPU counts as not clean, one CUDA context's reserve (where the
    worker did not measure it: `GpuShare.context_bytes`); how long memory nobody can be named
    for is waited on; what NVML's processes are worth here; and the worker's folder its trial
    processes mark warnings said in (`OncePerWorker`)."""

    nvml_module: str
    tolerance_mb: int
    context_reserve_mb: int
    unattributed_wait_s: float = 30.0
    view: ProcessView = ProcessView.UNKNOWN
    warned_in: Path | None = None

    def context_bytes(self, share: GpuShare) -> int:
        """One CUDA context on the share's GPUs: as the worker measured it, else assumed."""
        measured = share.context_bytes
        return measured if measured is not None else self.context_reserve_mb * MIB

    def start_check(self, warnings: OncePerWorker, share: GpuShare) -> NeighbourCheck:
        """The start check these limits make for a trial on `share`."""
        return NeighbourCheck(
            self.tolerance_mb * MIB, view=self.view, context_bytes=self.context_bytes(share),
            unattributed_wait_s=self.unattributed_wait_s, warnings=warnings,
            marks=TrialMarks.here(self.warned_in),
        )  # fmt: skip


def run_on_share(
    request: TrialRequest,
    share: GpuShare | None,
    limits: GpuLimits,
    run: Callable[[], TrialResult],
    leave: Callable[[TrialResult], None],
) -> TrialResult:
    """`run()` on the slot's GPUs, guarded; `leave` stores the guard's `gpu_guard` result
    before it kills the trial's process. Without a share, `run()` as it is; without NVML,
    unguarded."""
    if share is None:
        return run()
    warnings = OncePerWorker(logger, limits.warned_in)
    nvml = Nvml.open(limits.nvml_module)
    if nvml is None:
        note = f"unguarded: NVML ({limits.nvml_module}) did not open in the trial process"
        warnings.warn("nvml-open", f"{note}; trials run unguarded")
        unguarded = Measurements(gpu_accounting="unguarded", gpu_accounting_note=note)
        return run().measured_also(unguarded)
    with nvml:
        start = limits.start_check(warnings, share).check(nvml, share)
        if start.refusal is not None:
            logger.critical("%s", start.refusal)
            return TrialResult.device_refused_here(request, start.refusal)
        return _guarded(request, nvml, share, limits, start, run, leave, warnings)


def _guarded(
    request: TrialRequest,
    nvml: Nvml,
    share: GpuShare,
    limits: GpuLimits,
    start: StartCheck,
    run: Callable[[], TrialResult],
    leave: Callable[[TrialResult], None],
    warnings: OncePerWorker,
) -> TrialResult:
    """`run()` under the GPU memory guard; its result with what the guard saw."""
    reserve = limits.context_bytes(share)
    on_overrun = _leave_kill(request, share, reserve, leave)
    with GpuGuard(nvml, share, reserve, on_overrun, limits.view, warnings=warnings) as guard:
        result = run()
    neighbours = result.outcome is Outcome.OOM and guard.neighbour_caused()
    notes = "; ".join(note for note in (start.note, guard.accounting_note()) if note) or None
    seen = Measurements(
        gpu_process_peak_bytes=guard.peaks(), oom_caused_by_neighbour=neighbours,
        gpu_accounting=guard.accounting(), gpu_accounting_note=notes,
    )  # fmt: skip
    return result.measured_also(seen)


def _leave_kill(
    request: TrialRequest,
    share: GpuShare,
    context_bytes: int,
    leave: Callable[[TrialResult], None],
) -> Callable[[GpuOverrun], None]:
    """What the GPU memory guard does before it kills the trial's process: leave its result,
    `gpu_guard` with the figures it was killed for (never `oom`), as a result the trial told
    itself would say."""

    def on_overrun(overrun: GpuOverrun) -> None:
        logger.error("%s", overrun.text())
        found = overrun.figures
        figures = GpuGuardFigures(
            device=overrun.device, own_bytes=found.own, reserved_bytes=found.reserved,
            allowance_bytes=found.allowance, budget_bytes=found.budget,
        )  # fmt: skip
        seen = Measurements(
            gpu_guard=figures, gpu_process_peak_bytes={overrun.device: found.own},
            gpu_accounting=Source.NVML_PIDS, gpu_budget_bytes=share.budget_bytes,
            gpu_context_bytes=context_bytes, gpu_model=share.model,
        )  # fmt: skip
        result = TrialResult.here(request, Outcome.GPU_GUARD, overrun.text(), seen)
        leave(result)

    return on_overrun
