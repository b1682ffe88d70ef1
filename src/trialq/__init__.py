"""trialq: a job queue for GPU hyperparameter trials, one OS process per trial.

`import trialq` stays light: it loads neither Celery nor TensorFlow.
"""

from trialq.context import TrialContext
from trialq.errors import TrialPruned

__all__ = ["TrialContext", "TrialPruned", "__version__"]
__version__ = "0.1.0"
