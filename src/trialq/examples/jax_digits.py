"""A JAX trial: a small MLP in plain `jax.numpy` and `jax.grad` on the 8x8 digits images
scikit-learn ships (GPU or CPU; no Flax or Optax needed).

Nothing is downloaded. JAX runs on the trial's GPU share where it sees one (trialq sets
its memory fraction before JAX is imported), on the CPU otherwise. The trial reports the
validation accuracy at every epoch and stops when the driver's pruner says so; with the
param `fit_batch_size` true, it first finds the largest batch that fits its budget
(`trial.fit_batch_size`, recorded on the trial).
"""

from __future__ import annotations

import itertools
from typing import Any

from trialq.errors import TrialPruned
from trialq.examples.digits import load_digits
from trialq.trial.context import TrialContext

EPOCHS = 12
SEED = 0

Params = list[tuple[Any, Any]]
"""The MLP's weights: one (matrix, bias) pair a layer."""


def train(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Train one MLP with `params`; its validation accuracy and loss, and its batch size."""
    import jax

    (x_train, y_train), (x_val, y_val) = _flat(load_digits())
    batch = _batch_size(params, trial, len(x_train))
    key, shuffle = jax.random.split(jax.random.key(SEED + trial.number))
    weights = init(params, key)
    velocity = jax.tree.map(lambda w: w * 0.0, weights)
    step = _step(float(params.get("learning_rate", 0.05)))
    accuracy, loss = 0.0, float("nan")
    for epoch in range(int(params.get("epochs", EPOCHS))):
        order = jax.random.permutation(jax.random.fold_in(shuffle, epoch), len(x_train))
        for start in range(0, len(order), batch):
            chosen = order[start : start + batch]
            weights, velocity = step(weights, velocity, x_train[chosen], y_train[chosen])
        accuracy, loss = evaluate(weights, x_val, y_val)
        trial.report(accuracy, epoch)
        if trial.should_prune():
            raise TrialPruned(f"pruned at epoch {epoch} with val_accuracy={accuracy:.4f}")
    return {"val_accuracy": accuracy, "val_loss": loss, "batch_size": float(batch)}


def init(params: dict[str, Any], key: Any) -> Params:
    """64 inputs -> `hidden_units` x `layers` (ReLU) -> 10 logits, He-initialised."""
    import jax
    import jax.numpy as jnp

    hidden = int(params.get("hidden_units", 64))
    sizes = [64, *[hidden] * int(params.get("layers", 2)), 10]
    weights = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        key, sub = jax.random.split(key)
        scale = jnp.sqrt(2.0 / fan_in)
        weights.append((jax.random.normal(sub, (fan_in, fan_out)) * scale, jnp.zeros(fan_out)))
    return weights


def logits(weights: Params, x: Any) -> Any:
    """The MLP's forward pass."""
    import jax

    for matrix, bias in weights[:-1]:
        x = jax.nn.relu(x @ matrix + bias)
    matrix, bias = weights[-1]
    return x @ matrix + bias


def loss_of(weights: Params, x: Any, y: Any) -> Any:
    """Mean softmax cross-entropy."""
    import jax
    import jax.numpy as jnp

    log_p = jax.nn.log_softmax(logits(weights, x))
    return -jnp.mean(jnp.take_along_axis(log_p, y[:, None], axis=1))


def evaluate(weights: Params, x: Any, y: Any) -> tuple[float, float]:
    """Accuracy and mean cross-entropy on (x, y)."""
    accuracy = float((logits(weights, x).argmax(axis=1) == y).mean())
    return accuracy, float(loss_of(weights, x, y))


def _step(rate: float, momentum: float = 0.9) -> Any:
    """One jitted SGD-with-momentum step: (weights, velocity, x, y) -> (weights, velocity)."""
    import jax

    def step(weights: Params, velocity: Params, x: Any, y: Any) -> tuple[Params, Params]:
        grads = jax.grad(loss_of)(weights, x, y)
        velocity = jax.tree.map(lambda v, g: momentum * v + g, velocity, grads)
        return jax.tree.map(lambda w, v: w - rate * v, weights, velocity), velocity

    return jax.jit(step)


def _flat(data: tuple[tuple[Any, Any], tuple[Any, Any]]) -> tuple[tuple[Any, Any], ...]:
    """The images as (N, 64) float32 rows, the labels as int32, both JAX arrays."""
    import jax.numpy as jnp

    return tuple((jnp.asarray(x.reshape(len(x), 64)), jnp.asarray(y, "int32")) for x, y in data)


def _batch_size(params: dict[str, Any], trial: TrialContext, largest: int) -> int:
    """The param `batch_size`, or with `fit_batch_size` the largest batch (up to the
    training set) whose step fits."""
    if not params.get("fit_batch_size", False):
        return int(params.get("batch_size", 64))
    return trial.fit_batch_size(_step_at(params), start=32, max=largest)


def _step_at(params: dict[str, Any]) -> Any:
    """A try for `fit_batch_size`: one step of a fresh MLP at a given size, waited for
    (JAX dispatches asynchronously: an OOM surfaces when the result is read)."""
    import jax

    step = _step(float(params.get("learning_rate", 0.05)))

    def try_step(size: int) -> None:
        weights = init(params, jax.random.key(SEED))
        velocity = jax.tree.map(lambda w: w * 0.0, weights)
        x = jax.random.uniform(jax.random.key(1), (size, 64))
        y = jax.random.randint(jax.random.key(2), (size,), 0, 10)
        jax.block_until_ready(step(weights, velocity, x, y))  # type: ignore[no-untyped-call]

    return try_step
