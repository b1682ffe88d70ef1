"""A real GPU trial: a small Keras CNN on the 8x8 digits images scikit-learn ships.

Nothing is downloaded. The trial sets TensorFlow's memory growth in its own process before
anything touches the device, trains with the `TrialCallback` (so the driver's pruner can stop
it), and returns its validation metrics. The runner records the GPU allocator's peak.
"""

from __future__ import annotations

from typing import Any

from trialq.trial.context import TrialContext

EPOCHS = 12
SEED = 0


def train(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Train one CNN with `params` and return validation accuracy and loss."""
    tf = _tensorflow_with_memory_growth()
    import keras

    from trialq.keras import TrialCallback

    keras.utils.set_random_seed(SEED + trial.number)
    if params.get("mixed_precision", False):
        keras.mixed_precision.set_global_policy("mixed_float16")
    (x_train, y_train), (x_val, y_val) = load_digits()
    model = build_model(params)
    history = model.fit(
        x_train,
        y_train,
        validation_data=(x_val, y_val),
        epochs=int(params.get("epochs", EPOCHS)),
        batch_size=int(params.get("batch_size", 64)),
        callbacks=[TrialCallback(trial, monitor="val_accuracy")],
        verbose=0,
    )
    del tf
    return {
        "val_accuracy": float(history.history["val_accuracy"][-1]),
        "val_loss": float(history.history["val_loss"][-1]),
        "accuracy": float(history.history["accuracy"][-1]),
    }


def _tensorflow_with_memory_growth() -> Any:
    """Import TensorFlow and let each GPU grow its memory, before the device is initialised."""
    import tensorflow as tf

    for gpu in tf.config.list_physical_devices("GPU"):
        tf.config.experimental.set_memory_growth(gpu, True)
    return tf


def load_digits() -> tuple[tuple[Any, Any], tuple[Any, Any]]:
    """The digits images as (N, 8, 8, 1) floats in [0, 1], split 80/20, stratified."""
    from sklearn.datasets import load_digits as sklearn_digits
    from sklearn.model_selection import train_test_split

    data = sklearn_digits()
    images = (data.images / 16.0).astype("float32")[..., None]
    x_train, x_val, y_train, y_val = train_test_split(
        images, data.target, test_size=0.2, random_state=SEED, stratify=data.target
    )
    return (x_train, y_train), (x_val, y_val)


def build_model(params: dict[str, Any]) -> Any:
    """Conv -> conv -> pool -> dense -> softmax, compiled with the chosen optimizer."""
    import keras

    filters = int(params.get("filters", 32))
    model = keras.Sequential(
        [
            keras.Input(shape=(8, 8, 1)),
            keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
            keras.layers.Conv2D(filters, 3, padding="same", activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(int(params.get("dense_units", 64)), activation="relu"),
            keras.layers.Dense(10, activation="softmax", dtype="float32"),
        ]
    )
    model.compile(
        optimizer=_optimizer(params),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def _optimizer(params: dict[str, Any]) -> Any:
    import keras

    rate = float(params.get("learning_rate", 1e-3))
    if params.get("optimizer", "adam") == "sgd":
        return keras.optimizers.SGD(learning_rate=rate, momentum=0.9)
    return keras.optimizers.Adam(learning_rate=rate)
