"""A tiny JAX trial for the framework adapters' end-to-end test (CPU): it imports jax at
module level, so `[trial] framework = "auto"` finds it in the source."""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp

JAX_OOM = (
    "RESOURCE_EXHAUSTED: Failed to allocate request for 2.99GiB (3206250496B) on device ordinal 0"
)
"""What JAX raised on a GPU that was full (issue 27), with its real class below."""


def step(params: dict[str, Any]) -> dict[str, float]:
    """One jitted gradient step; with `oom`, JAX's runtime error with XLA's status, hidden
    behind another error raised while handling it (`__context__`, `from None`)."""
    loss, _grad = jax.value_and_grad(lambda w: jnp.sum((w * 2.0 - 1.0) ** 2))(jnp.ones(4))
    if params.get("oom"):
        try:
            raise jax.errors.JaxRuntimeError(JAX_OOM)
        except jax.errors.JaxRuntimeError:
            raise ValueError("the fit did not finish") from None
    preallocate = os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE") == "false"
    return {"loss": float(loss), "preallocate_off": float(preallocate)}
