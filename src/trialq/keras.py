"""`TrialCallback`: report/prune for `model.fit`, across hosts, and resume after preemption.

Like optuna-integration's pruning callback, but the pruner lives in the driver: values go
up through Redis at every epoch end and the driver's verdict comes back the same way.
With `backup` (the default), it also backs the fit up into `trial.checkpoint_dir` through
Keras' own `keras.callbacks.BackupAndRestore` at every epoch end, so the next attempt of a
trial that was killed or preempted starts at the epoch where the last one stopped; and it
ends the fit at the end of an epoch once `trial.should_stop()` says so (docs/preemption.md).
Import this module only in trial code (it imports Keras).
"""

from __future__ import annotations

import math
from typing import Any

import keras

from trialq.errors import TrialPruned
from trialq.trial.context import TrialContext

BACKUP_FOLDER = "keras-backup"
"""The folder in `trial.checkpoint_dir` that `BackupAndRestore` writes."""


class TrialCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Reports `monitor` at every epoch end; stops training with `TrialPruned` when told.

    `backup`: restore the fit from, and save it at every epoch end to,
    `trial.checkpoint_dir / "keras-backup"`; and stop the fit (`model.stop_training`) after
    the epoch in which `trial.should_stop()` became true, its state saved. Put it first in
    `callbacks` so that the epoch is saved before any later callback can end the process.
    """

    def __init__(
        self, trial: TrialContext, monitor: str = "val_accuracy", backup: bool = True
    ) -> None:
        super().__init__()
        self.trial = trial
        self.monitor = monitor
        self.backup: keras.callbacks.BackupAndRestore | None = None
        if backup:
            self.backup = keras.callbacks.BackupAndRestore(
                str(trial.checkpoint_dir / BACKUP_FOLDER),
                delete_checkpoint=False,  # the trial's folder goes when the trial is over
            )

    def set_model(self, model: Any) -> None:
        """Keras hands the model over before the fit; the backup needs it too."""
        super().set_model(model)
        if self.backup is not None:
            self.backup.set_model(model)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Restore the last attempt's weights, optimizer state and epoch, if it saved any."""
        if self.backup is None:
            return
        saved = (self.trial.checkpoint_dir / BACKUP_FOLDER).exists()
        if saved or self.model.built:  # Keras refuses an unbuilt model, even with nothing saved
            self.backup.on_train_begin(logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Save the epoch, report its value, then ask whether to prune, or to stop."""
        if self.backup is not None:
            self.backup.on_epoch_end(epoch, logs)
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
        last_epoch = epoch + 1 >= int((self.params or {}).get("epochs", math.inf))
        if self.backup is not None and not last_epoch and self.trial.should_stop():
            self.model.stop_training = True  # saved above; the next attempt goes on from here
