"""One trial's framework, from the spec's choice to its peaks: `FrameworkSession`.

The runner walks it through three moments: `before_import` (the framework chosen or found
in the entrypoint's source; its environment set), `after_import` (found from what was
loaded, if not before; the memory cap applied, before the trial's first op), and `record`
(after the trial: the peaks, and what was capped, as the trial's result records them).
"""

from __future__ import annotations

import logging
import os
from collections.abc import MutableMapping, Set
from dataclasses import dataclass

from trialq.gpu.share import GpuShare
from trialq.trial.frameworks import Adapter, Cap, adapter, detect
from trialq.wire.frameworks import AUTO

_log = logging.getLogger("trialq.frameworks")

NO_SHARE = "no GPU share (CUDA_VISIBLE_DEVICES unset or empty): nothing to cap"

_chosen: Adapter | None = None
"""The framework of this process's trial (one trial a process), once chosen."""


def allocator_peaks() -> tuple[int, ...] | None:
    """The allocator's peak on each visible GPU of this process's trial now, or None (no
    framework chosen, or none to read): the GPU memory guard's figure of the trial's own
    memory where NVML gives none (`trialq.gpu.attribution`)."""
    return _peaks(_chosen)


def allocator_reserved() -> tuple[int, ...] | None:
    """What the allocator of this process's trial holds now on each visible GPU: () where
    no framework was chosen or its runtime has not started; None where the framework does
    not say, or the reading failed (the GPU memory guard then kills for nothing)."""
    if _chosen is None:
        return ()
    try:
        return _chosen.reserved()
    except Exception:
        return None


def chosen_framework() -> str | None:
    """The framework of this process's trial, once chosen."""
    return _chosen.name if _chosen is not None else None


@dataclass(frozen=True)
class FrameworkRecord:
    """What a trial records of its framework and GPUs (`TrialResult`'s `framework` and
    `gpu_*` fields)."""

    framework: str | None = None
    peaks: tuple[int, ...] | None = None
    budget_bytes: int | None = None
    cap_applied: bool = False
    cap_note: str | None = None
    model: str | None = None
    context_bytes: int | None = None
    """One CUDA context, as the worker measured it (`GpuShare.context_bytes`)."""

    @property
    def largest_peak(self) -> int | None:
        """The largest of the peaks (`gpu_peak_bytes`)."""
        return max(self.peaks) if self.peaks else None


class FrameworkSession:
    """A trial process's framework: its environment, its cap, its peaks."""

    def __init__(
        self,
        choice: str,
        share: GpuShare | None,
        environ: MutableMapping[str, str] | None = None,
    ) -> None:
        self._choice = choice
        self._share = share
        self._environ = os.environ if environ is None else environ
        self._adapter: Adapter | None = None
        self._in_time = False
        self._cap = Cap(False, NO_SHARE if share is None else "the trial never started")

    @property
    def framework(self) -> str | None:
        """The framework chosen or found so far."""
        return self._adapter.name if self._adapter is not None else None

    def before_import(self, source: str | None, function: str) -> None:
        """The spec's framework, or the one the entrypoint `function` of the module `source`
        uses: its environment."""
        name: str | None = self._choice
        if self._choice == AUTO:
            name = detect.in_source(source, function, self._environ)
        if name is not None:
            self._choose(name)

    def after_import(self, before: Set[str]) -> None:
        """Found from what the import loaded (if not before); then the cap."""
        if self._adapter is None and self._choice == AUTO:
            name = detect.loaded(before, self._environ)
            if name is not None:
                self._choose(name)
        if self._adapter is not None and self._share is not None:
            self._cap = _capped(self._adapter, self._share, self._in_time)
        elif self._share is not None:
            self._cap = Cap(False, "no framework found: nothing to cap")

    def record(self) -> FrameworkRecord:
        """After the trial: the peaks per GPU and the cap, whatever the outcome."""
        share = self._share
        cap = self._cap.settled()
        return FrameworkRecord(
            framework=self.framework,
            peaks=_peaks(self._adapter),
            budget_bytes=share.budget_bytes if share is not None else None,
            cap_applied=cap.applied,
            cap_note=cap.note,
            model=share.model if share is not None else None,
            context_bytes=share.context_bytes if share is not None else None,
        )

    def _choose(self, name: str) -> None:
        global _chosen
        self._adapter = _chosen = adapter(name)
        self._in_time = self._adapter.started() is None
        for variable, value in self._adapter.environment(self._share, self._environ).items():
            if value is None:
                self._environ.pop(variable, None)
            else:
                self._environ[variable] = value


def _capped(chosen: Adapter, share: GpuShare, in_time: bool) -> Cap:
    """The adapter's cap; one that fails is said on the trial, never the trial's failure."""
    try:
        cap = chosen.cap(share, in_time)
    except Exception as exc:
        cap = Cap(False, f"{chosen.name}'s cap failed: {type(exc).__name__}: {exc}")
    if not cap.applied or cap.note:
        _log.warning("GPU memory cap %s: %s", "applied" if cap.applied else "not applied", cap.note)
    return cap


def _peaks(chosen: Adapter | None) -> tuple[int, ...] | None:
    """The adapter's peaks; a reading that fails is no reading."""
    if chosen is None:
        return None
    try:
        return chosen.peaks()
    except Exception:
        return None
