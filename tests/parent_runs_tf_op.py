"""Preloaded by a test worker whose parent breaks the rule: it runs a TensorFlow op (in the
parent, when its first trial arrives), after which no trial process may be forked from it."""

from typing import Any

import tensorflow as tf
from celery import signals


@signals.task_received.connect
def _run_an_op_in_the_parent(**_: Any) -> None:
    tf.constant(1.0) + 1.0
