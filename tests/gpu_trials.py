"""Trials for the tests on a REAL GPU (tests/gpu): each allocates GPU memory through its
framework, PyTorch or JAX, in pieces, so a cap or the GPU memory guard can stop it part way.
Their requests name the framework (`framework = "torch"` or `"jax"`): this module imports
both, inside the functions, so nothing here runs at import on a machine without them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from trialq import TrialContext

MIB = 2**20
PIECE_MB = 128
PAUSE_S = 0.01
"""Between two pieces: time for the GPU memory guard (it samples every 0.05 s) to see them."""


def torch_allocates(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Allocates `mb` MiB on each GPU it sees, holds it `hold_s`, and says how many GPUs it
    saw and when it held its memory. With `uncapped`, it first lifts trialq's cap (as a trial
    that sets its own memory fraction would): only the GPU memory guard can stop it then."""
    import torch

    devices = range(torch.cuda.device_count())
    if params.get("uncapped"):
        for index in devices:
            torch.cuda.set_per_process_memory_fraction(1.0, index)
    started = time.time()
    held = [
        torch.ones(PIECE_MB * MIB, dtype=torch.uint8, device=f"cuda:{index}")
        for index in devices
        for _ in _pieces(int(params["mb"]))
    ]
    time.sleep(float(params.get("hold_s", 0.0)))
    return {
        "devices": float(len(devices)), "pieces": float(len(held)),
        "started": started, "ended": time.time(),
    }  # fmt: skip


def jax_allocates(params: dict[str, Any], trial: TrialContext) -> dict[str, float]:
    """Allocates `mb` MiB on JAX's first GPU and holds it `hold_s`."""
    import jax
    import jax.numpy as jnp

    device = jax.devices("gpu")[0]
    held = []
    for _ in _pieces(int(params["mb"])):
        with jax.default_device(device):
            held.append(jnp.ones(PIECE_MB * MIB // 4, dtype=jnp.float32).block_until_ready())
    time.sleep(float(params.get("hold_s", 0.0)))
    return {"pieces": float(len(held))}


def _pieces(mb: int) -> Iterator[int]:
    """One step per `PIECE_MB` of `mb`, pausing after each so a guard can watch it grow."""
    for index in range(max(1, mb // PIECE_MB)):
        yield index
        time.sleep(PAUSE_S)
