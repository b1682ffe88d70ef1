"""`TrialCallback`: report/prune for `model.fit`, across hosts.

Like optuna-integration's pruning callback, but the pruner lives in the driver: values go
up through Redis at every epoch end and the driver's verdict comes back the same way.
Import this module only in trial code (it imports Keras).
"""

from __future__ import annotations

import math
from typing import Any

import keras

from trialq.errors import TrialPruned
from trialq.trial.context import TrialContext


class TrialCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Reports `monitor` at every epoch end; stops training with `TrialPruned` when told."""

    def __init__(self, trial: TrialContext, monitor: str = "val_accuracy") -> None:
        super().__init__()
        self.trial = trial
        self.monitor = monitor

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Report this epoch's value, then ask whether the driver's pruner said stop."""
        value = (logs or {}).get(self.monitor)
        if value is None:
            available = ", ".join(sorted(logs or {}))
            raise KeyError(f"TrialCallback: no {self.monitor!r} in the fit logs ({available})")
        value = float(value)
        if math.isfinite(value):
            self.trial.report(value, epoch)
        if self.trial.should_prune():
            self.model.stop_training = True
            raise TrialPruned(f"pruned at epoch {epoch} with {self.monitor}={value:.6g}")
