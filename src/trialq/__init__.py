"""trialq: a job queue for GPU hyperparameter trials, one OS process per trial.

`import trialq` stays light: it loads neither Celery, Optuna nor TensorFlow. From Python, a
study is `trialq.optimize(...)` (docs/python-api.md); a trial process gets a `TrialContext`.
"""

from trialq.api import load_spec, optimize, run, study_spec
from trialq.errors import TrialPruned, TrialqError, UsageError
from trialq.trial.context import TrialContext

__all__ = [
    "TrialContext",
    "TrialPruned",
    "TrialqError",
    "UsageError",
    "__version__",
    "load_spec",
    "optimize",
    "run",
    "study_spec",
]
__version__ = "0.1.0"
