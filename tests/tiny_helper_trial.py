"""A trial whose source names no framework: it reaches PyTorch through another module, so
`auto` finds the framework from what its import loaded."""

from __future__ import annotations

from typing import Any

import tiny_torch_trial


def step(params: dict[str, Any]) -> dict[str, float]:
    return tiny_torch_trial.step(params)
