"""Writing a trial's user attrs in one storage transaction.

The driver records a dozen user attrs a trial (docs/design.md, "What every finished trial
records"). Optuna's RDB storage commits each `Trial.set_user_attr` on its own, after reading
the trial again: about 4 ms each with PostgreSQL on this project's machines, and more than the
trial's `tell`. `set_user_attrs` writes them all at once: through the driver's
`MirroredStorage` (which batches them with the trial's next write), in one transaction on a
bare RDB storage, and one `set_user_attr` a key on any other storage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import optuna

from trialq.driver._storage.mirror import MirroredStorage, rdb_under
from trialq.driver._storage.sql import TrialWrites, commit_checked


def set_user_attrs(trial: optuna.Trial, attrs: Mapping[str, Any]) -> None:
    """`trial.set_user_attr(key, value)` for every item, in one transaction where possible."""
    if not attrs:
        return
    storage = trial.storage
    rdb = rdb_under(storage)
    if isinstance(storage, MirroredStorage):
        storage.set_trial_user_attrs(trial._trial_id, attrs)
    elif rdb is not None:
        commit_checked(rdb, trial._trial_id, TrialWrites(user_attrs=dict(attrs)))
    else:
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        return
    trial._cached_frozen_trial.user_attrs.update(attrs)
