"""`TrialContext`: what a trial's own code sees of trialq while it runs."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from trialq.wire.channel import ReportChannel, TrialAddress


class TrialContext:
    """The running trial: its number, params and attempt, and the way to report and prune."""

    def __init__(
        self,
        address: TrialAddress,
        params: Mapping[str, Any],
        channel: ReportChannel | None,
    ) -> None:
        self._address = address
        self._params = dict(params)
        self._channel = channel
        self.last_step: int | None = None

    @property
    def number(self) -> int:
        """The Optuna trial number (the same on every attempt)."""
        return self._address.number

    @property
    def attempt(self) -> int:
        """1 on the first run, 2 after the first lost worker, and so on."""
        return self._address.attempt

    @property
    def params(self) -> dict[str, Any]:
        """The parameter set the driver sampled (a copy)."""
        return dict(self._params)

    def report(self, value: float, step: int) -> None:
        """Send an intermediate objective value to the driver's pruner."""
        if not math.isfinite(value):
            return  # Optuna ignores non-finite intermediate values too
        self.last_step = step
        if self._channel is not None:
            self._channel.report(self._address, step, float(value))

    def should_prune(self) -> bool:
        """Whether the driver's pruner asked this trial to stop; raise `TrialPruned` if so."""
        return self._channel is not None and self._channel.prune_requested(self._address)
