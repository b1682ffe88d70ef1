"""The Celery edge: the app, the task, the dispatcher the driver uses and the worker's pool.
The only package that imports Celery, kombu or billiard."""
