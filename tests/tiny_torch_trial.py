"""A tiny PyTorch trial for the framework adapters' end-to-end test (CPU): it imports torch
at module level, as most trials do, so `[trial] framework = "auto"` finds it in the source."""

from __future__ import annotations

import os
from typing import Any

import torch


def step(params: dict[str, Any]) -> dict[str, float]:
    """One optimizer step of a linear model; with `oom`, an OOM re-raised as another error,
    as a DataLoader or Lightning does (`raise ... from`)."""
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    optimizer.step()
    if params.get("oom"):
        try:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except torch.OutOfMemoryError as exc:
            raise RuntimeError("training step failed") from exc
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF") == "expandable_segments:True"
    return {"loss": float(loss), "alloc_conf_set": float(conf)}
