"""`TrialCallback`: report/prune for Lightning's `Trainer.fit`, across hosts (as
`trialq.keras` is for Keras).

Like optuna-integration's `PyTorchLightningPruningCallback`, but the pruner lives in the
driver: the monitored metric goes up through Redis at every validation end and the driver's
verdict comes back the same way. A pruned fit raises `TrialPruned` (Lightning runs its
`on_exception` hooks and re-raises it; the trial ends `pruned`). Once `trial.should_stop()`
says yes, it saves a checkpoint in `trial.checkpoint_dir` and ends the fit gracefully; the
next attempt resumes with `trainer.fit(..., ckpt_path=resume_path(trial))`
(docs/preemption.md). Import this module only in trial code (it imports Lightning).
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl

from trialq.errors import TrialPruned
from trialq.trial.context import TrialContext

CHECKPOINT = "lightning-last.ckpt"
"""The file in `trial.checkpoint_dir` a stopped fit saves, and the next attempt resumes."""


def resume_path(trial: TrialContext) -> str | None:
    """The checkpoint an earlier attempt of this trial saved, for `fit(ckpt_path=...)`;
    None on a first attempt or outside a worker."""
    try:
        path = trial.checkpoint_dir / CHECKPOINT
    except RuntimeError:  # not run by a trialq worker: no checkpoint folder
        return None
    return str(path) if path.exists() else None


class TrialCallback(pl.Callback):
    """Reports `monitor` at every validation end (the step is the epoch); raises
    `TrialPruned` when the driver's pruner says so; saves and stops on `should_stop()`."""

    def __init__(self, trial: TrialContext, monitor: str = "val_accuracy") -> None:
        super().__init__()
        self.trial = trial
        self.monitor = monitor

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Report the value, then ask whether to prune, or to stop."""
        if trainer.sanity_checking:
            return  # the two batches Lightning checks before the fit are no epoch's value
        value = self._value(trainer)
        epoch = int(trainer.current_epoch)
        if math.isfinite(value):
            self.trial.report(value, epoch)
        if self.trial.should_prune():
            raise TrialPruned(f"pruned at epoch {epoch} with {self.monitor}={value:.6g}")
        if not _last_epoch(trainer) and self.trial.should_stop():
            trainer.save_checkpoint(self.trial.checkpoint_dir / CHECKPOINT)
            trainer.should_stop = True  # the next attempt goes on from the saved checkpoint

    def _value(self, trainer: pl.Trainer) -> float:
        metrics: dict[str, Any] = dict(trainer.callback_metrics)
        if self.monitor not in metrics:
            available = ", ".join(sorted(metrics))
            raise KeyError(f"TrialCallback: no {self.monitor!r} logged ({available})")
        return float(metrics[self.monitor])


def _last_epoch(trainer: pl.Trainer) -> bool:
    """The fit's last epoch: its value is final, nothing is left to resume."""
    max_epochs = trainer.max_epochs
    return max_epochs is not None and max_epochs >= 0 and trainer.current_epoch + 1 >= max_epochs
