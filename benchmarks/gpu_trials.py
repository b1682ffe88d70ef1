"""The trials `python -m benchmarks.gpu` runs on a real GPU (entrypoints `benchmarks.gpu_trials:*`).

Each records what the device held when it started (NVML, before it touches CUDA itself), so
that "GPU memory in use after each trial" reads the same in one process and in trialq.
"""

from __future__ import annotations

import time
from typing import Any

from trialq import TrialPruned

MiB = 1024 * 1024
CHUNK = 64 * MiB
SMALL_EPOCHS = 3
"""Few epochs: a run of 16 trials at one a GPU, three times over, fits a 9-minute call."""
RESNET_STEPS = 30
RESNET_BATCH = 64
KERAS_EPOCHS = 6


class NoTrial:
    """The trial context of an in-process loop (Optuna's own `study.optimize`): no reports."""

    number = 0

    def report(self, value: float, step: int) -> None:
        pass

    def should_prune(self) -> bool:
        return False


def nvml() -> Any:
    """NVML's binding: `pynvml`, or the module `TRIALQ_NVML_MODULE` names as trialq's
    workers read it (a CPU rehearsal's fake, tests/fake_nvml.py)."""
    import importlib
    import os

    return importlib.import_module(os.environ.get("TRIALQ_NVML_MODULE") or "pynvml")


def device_used_bytes(index: int = 0) -> int:
    """NVML's memory in use on the trial's first GPU (no CUDA context made)."""
    pynvml = nvml()
    pynvml.nvmlInit()
    return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).used)


def small(params: dict[str, Any], trial: Any) -> dict[str, float]:
    """The digits CNN of `trialq.examples.torch_digits` (a few MiB), `SMALL_EPOCHS` epochs."""
    from trialq.examples import torch_digits

    at_start = device_used_bytes()
    metrics = torch_digits.train({"epochs": SMALL_EPOCHS, **params}, trial)
    return {**metrics, "device_used_at_start_bytes": float(at_start)}


def mid(params: dict[str, Any], trial: Any) -> dict[str, float]:
    """An MLP of width 1024-8192 on random 4096 x 1024 batches: hundreds of MiB to GiBs,
    a different size each trial (what makes one process's cache grow)."""
    import torch

    at_start = device_used_bytes()
    width = int(params.get("width", 4096))
    model = torch.nn.Sequential(
        torch.nn.Linear(1024, width), torch.nn.ReLU(),
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 10),
    ).cuda()  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(4096, 1024, device="cuda"), torch.randint(0, 10, (4096,), device="cuda")
    for step in range(60):
        optimizer.zero_grad(set_to_none=True)
        loss: Any = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 20 == 19:
            trial.report(float(loss.detach()), step)
            if trial.should_prune():
                raise TrialPruned()
    return {"loss": float(loss), "device_used_at_start_bytes": float(at_start)}


def resnet(params: dict[str, Any], trial: Any) -> dict[str, float]:
    """A torchvision ResNet-18 (no downloaded weights) on synthetic 224 x 224 images, bf16
    autocast, `cudnn.benchmark` on: a real model's convolutions through cuDNN's autotuner."""
    import torch
    import torchvision

    at_start = device_used_bytes()
    torch.backends.cudnn.benchmark = True
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    model = model.cuda().to(memory_format=torch.channels_last)
    rate = float(params.get("learning_rate", 0.05))
    optimizer = torch.optim.SGD(model.parameters(), lr=rate, momentum=0.9)
    generator = torch.Generator(device="cuda").manual_seed(int(trial.number))
    shape = (RESNET_BATCH, 3, 224, 224)
    x = torch.randn(shape, device="cuda", generator=generator)
    x = x.to(memory_format=torch.channels_last)
    y = torch.randint(0, 10, (RESNET_BATCH,), device="cuda", generator=generator)
    for step in range(RESNET_STEPS):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss: Any = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 10 == 9:
            trial.report(float(loss.detach()), step)
            if trial.should_prune():
                raise TrialPruned()
    return {"loss": float(loss), "device_used_at_start_bytes": float(at_start)}


def keras_digits(params: dict[str, Any], trial: Any) -> dict[str, float]:
    """The digits example's Keras model on whatever backend `KERAS_BACKEND` names (torch or
    jax here: no TensorFlow), fitted with `trialq.keras.TrialCallback`, which reports every
    epoch and stops the fit when the driver's pruner says so. Its spec names the framework:
    `auto` would read `trialq.keras` as TensorFlow's."""
    from trialq.examples.digits import build_model, load_digits
    from trialq.keras import TrialCallback

    # no keras.utils.set_random_seed: it imports TensorFlow wherever TensorFlow is installed
    (x_train, y_train), (x_val, y_val) = load_digits()
    history = build_model(params).fit(
        x_train, y_train, validation_data=(x_val, y_val), epochs=KERAS_EPOCHS, batch_size=64,
        callbacks=[TrialCallback(trial, monitor="val_accuracy")], verbose=0,
    )  # fmt: skip
    return {"val_accuracy": float(history.history["val_accuracy"][-1])}


def hog_or_train(params: dict[str, Any], trial: Any) -> dict[str, float]:
    """Trial 0 allocates twice its budget in 64 MiB chunks, holding them; the others train
    the small model for about `seconds`."""
    import os

    import torch

    if trial.number != 0:
        deadline = time.monotonic() + float(params.get("seconds", 20))
        metrics: dict[str, float] = {}
        while time.monotonic() < deadline:
            metrics = small({"epochs": 2}, trial)
        return metrics
    budget = int(os.environ["TRIALQ_GPU_BUDGET_BYTES"])
    held = [
        torch.empty(CHUNK, dtype=torch.uint8, device="cuda") for _ in range(2 * budget // CHUNK)
    ]
    return {"held_bytes": float(len(held) * CHUNK)}


def jax_over_budget(params: dict[str, Any], trial: Any) -> dict[str, float]:
    """Allocates 64 MiB JAX arrays until it runs out: under trialq's cap it must end `oom`
    at its budget, whatever the card has free."""
    import jax.numpy as jnp

    held = []
    while True:
        held.append(jnp.ones(CHUNK // 4, dtype=jnp.float32).block_until_ready())


def stand_in(params: dict[str, Any], trial: Any) -> dict[str, float]:
    """No device work: two reports a tenth of a second apart. The CPU rehearsal's trial
    (tests/integration/test_gpu_benchmark_rehearsal.py), for the benchmark's plumbing; it
    never makes a figure."""
    for step in range(2):
        time.sleep(0.1)
        trial.report(float(step), step)
    return {"loss": float(params.get("learning_rate", 0.0))}


def tiny_torch(params: dict[str, Any], trial: Any) -> dict[str, float]:
    """One small op and one optimizer step on the GPU: a trial that is all start cost."""
    import torch

    layer = torch.nn.Linear(8, 1).cuda()
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    loss: Any = layer(torch.ones(4, 8, device="cuda")).sum()
    loss.backward()
    optimizer.step()
    return {"value": float(loss)}
