"""The largest values trialq takes from a user or a service, and why each is the limit.

A value past these is refused where it enters (the spec, the command line, a trial's
report) in one line naming it, never carried to where a storage, Optuna or a clock would
fail on it after the study exists (such values ended the driver with exit 4).
"""

from __future__ import annotations

INT32_MAX = 2**31 - 1
"""The most of anything a spec counts or sizes (trials, retries, GPUs, MB), and the largest
report step: Optuna's RDB schema stores trial numbers and report steps as `Integer`, which
PostgreSQL holds in 32 bits (`integer out of range` past it; SQLite stops at 64)."""

EXACT_INT_MAX = 2**53
"""The largest int parameter (and enqueued int value) by magnitude: Optuna stores every
parameter as a double (`trial_params.param_value`), exact for integers up to 2**53."""

GRID_POINTS_MAX = 2**53
"""The most points a stepped parameter may have: Optuna divides its range by its step in
`decimal` (28 digits) and past float resolution a step means nothing anyway."""

SECONDS_MAX = 1e9
"""The longest time a spec or argument may give (about 31 years): every wait is handed to
Python's clocks and locks, which refuse timeouts past `threading.TIMEOUT_MAX` (9.2e9 s),
and some are added together first."""
