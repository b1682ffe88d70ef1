"""Which tracker each `[tracking]` key builds: the one place a tracking library is named.
Each adapter module is imported only when its key is on, and it imports its library."""

from __future__ import annotations

import importlib

from trialq.errors import UsageError
from trialq.tracking.base import Tracker
from trialq.tracking.config import TrackingSection

ADAPTERS = {
    "tensorboard": ("trialq.tracking.tensorboard", "tensorboard", "tensorboard"),
    "mlflow": ("trialq.tracking.mlflow", "mlflow", "mlflow"),
    "wandb": ("trialq.tracking.wandb", "wandb", "wandb"),
}
"""A key's adapter module, the library it needs, and the pyproject extra that installs it."""


def trackers_for(section: TrackingSection, where: str) -> list[Tracker]:
    """The trackers `[tracking]` turns on; a library that is not installed is refused in one
    line (exit 2) before the study starts."""
    trackers: list[Tracker] = []
    for name in section.names:
        module_name, library, extra = ADAPTERS[name]
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            if exc.name is None or exc.name.split(".")[0] != library:
                raise
            raise UsageError(
                f"{where}: tracking.{name}: {library} is not installed here "
                f"(pip install 'trialq[{extra}]')"
            ) from None
        trackers.append(module.tracker(getattr(section, name)))  # each module's entry
    return trackers
