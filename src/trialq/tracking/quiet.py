"""Tracking libraries kept out of the user's stderr: a server that is down makes MLflow's
HTTP client warn at every retry (urllib3's `Retrying (Retry(total=6 ...` lines, dozens a
trial) and W&B print its own network errors, which bury the one line trialq says of the
trials not recorded (`trialq.tracking.base.Tracking`).

Their loggers keep their records to themselves (no propagation to stderr's handlers); their
Python warnings are ignored; each library is asked for few, short retries where it reads that
from the environment and the user has not set it. Only the driver's process is quieted: the
trackers run there, and no user code does.
"""

from __future__ import annotations

import logging
import os
import warnings

LIBRARY_LOGGERS = ("urllib3", "requests", "mlflow", "wandb", "git", "tensorboard", "absl")
"""The loggers of the tracking libraries and of the HTTP clients they retry through."""

FEW_RETRIES = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    "WANDB_SILENT": "true",
    "WANDB_INIT_TIMEOUT": "20",
}
"""Each library's own bound on one call, where the user has not set one: MLflow's defaults (7
retries, backoff 2, 120 s a request) hold one call for minutes."""


def quiet_tracking_libraries() -> None:
    """Keep the tracking libraries' log records, warnings and retries off stderr (once is
    enough; again changes nothing)."""
    for name in LIBRARY_LOGGERS:
        library = logging.getLogger(name)
        library.propagate = False
        if not library.handlers:
            library.addHandler(logging.NullHandler())
    for module in LIBRARY_LOGGERS:
        warnings.filterwarnings("ignore", module=rf"{module}(\.|$)")
    for name, value in FEW_RETRIES.items():
        os.environ.setdefault(name, value)
