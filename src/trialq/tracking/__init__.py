"""Tracking: each told trial also recorded in MLflow, Weights & Biases or TensorBoard.

The driver records a trial after it told Optuna (it has the params, values, reports and
user attrs); it sees only the `Tracker` protocol and `Tracking`, which runs the configured
trackers off the loop's thread. Each library is imported by its own module, only when the
spec's `[tracking]` names it (docs/tracking.md).
"""

from trialq.tracking.base import StudyInfo, ToldTrial, Tracker, Tracking
from trialq.tracking.config import TrackingSection
from trialq.tracking.registry import trackers_for

__all__ = ["StudyInfo", "ToldTrial", "Tracker", "Tracking", "TrackingSection", "trackers_for"]
