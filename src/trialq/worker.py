"""`celery -A trialq.worker worker`: the public name of the worker's Celery app.

The app, its task and its signal handlers live in the Celery edge (`trialq._celery.worker`);
importing this module registers them, as Celery needs.
"""

from trialq._celery.worker import app

__all__ = ["app"]
