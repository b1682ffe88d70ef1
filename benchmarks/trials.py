"""The trials every approach of the overhead benchmark runs: the same functions, same params.

Each takes `(params, trial=None)`, so trialq's runner, a Celery task and a plain loop can all
call it. TensorFlow is imported inside the trial, as a user's trial would; nothing else heavy
is imported here, since trialq imports this module afresh in every trial's process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Trial = Callable[..., Any]


def noop(params: dict[str, Any], trial: object = None) -> float:
    """Nothing at all: what remains is the cost of running a trial."""
    return float(params["x"])


def tf_op(params: dict[str, Any], trial: object = None) -> float:
    """One small TensorFlow op: the import (or not) and the runtime's start in this process."""
    import tensorflow as tf

    return float(tf.reduce_sum(tf.ones((2, 2)) * params["x"]))


def keras_fit(params: dict[str, Any], trial: object = None) -> dict[str, float]:
    """A small Keras model fitted for one epoch: what leaks when trials share a process."""
    import keras
    import numpy as np

    rng = np.random.default_rng(int(params["seed"]))
    x = rng.normal(size=(512, 8)).astype("float32")
    y = (x.sum(axis=1) > 0).astype("float32")
    model = keras.Sequential(
        [
            keras.Input(shape=(8,)),
            keras.layers.Dense(int(params["units"]), activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(float(params["learning_rate"])),
        loss="binary_crossentropy",
        metrics=["accuracy"],
    )
    history = model.fit(x, y, epochs=1, batch_size=64, verbose=0)
    return {"accuracy": float(history.history["accuracy"][-1])}


WORKLOADS: dict[str, Trial] = {"noop": noop, "tf": tf_op, "keras": keras_fit}


def stepper(params: dict[str, Any], trial: Any = None) -> float:
    """`steps` steps of `step_s` seconds, each logged (one line a step, in `log`); with
    `checkpoint`, the step reached is saved in `trial.checkpoint_dir` and resumed from. On
    `should_stop()` it saves and returns: the attempt is preempted (benchmarks/preemption.py).
    """
    import time
    from pathlib import Path

    saved = trial.checkpoint_dir / "step"
    start = int(saved.read_text()) if params["checkpoint"] and saved.exists() else 0
    with Path(params["log"]).open("a") as log:
        for step in range(start, int(params["steps"])):
            time.sleep(float(params["step_s"]))
            log.write(f"{trial.number} {trial.attempt} {step}\n")
            log.flush()
            if params["checkpoint"]:
                saved.write_text(str(step + 1))
            if trial.should_stop():
                return 0.0
    return 1.0


def sleeper(params: dict[str, Any], trial: Any = None) -> float:
    """A trial of `BENCH_TRIAL_S` seconds (its worker's environment) that returns a sphere
    of its float params: the length of a GPU trial, none of its work."""
    import os
    import time

    time.sleep(float(os.environ.get("BENCH_TRIAL_S", "1")))
    return float(sum(v * v for v in params.values() if isinstance(v, float)))
