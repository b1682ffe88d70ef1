"""trialq: a job queue for GPU hyperparameter trials, one OS process per trial.

`import trialq` stays light: it loads neither Celery nor TensorFlow.
"""

from trialq.errors import TrialPruned
from trialq.trial.context import TrialContext

__all__ = ["TrialContext", "TrialPruned", "__version__"]
__version__ = "0.1.0"
