"""The frameworks trialq knows by name: which imports reveal each, and what a worker preloads.

Names and a static reading of source (`ast`) only: nothing here imports a framework, so the
driver (`submit-study --local` picks its workers' preload from the spec) and a trial process
(`[trial] framework = "auto"`, decided before the entrypoint is imported) share one table.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from typing import Literal

AUTO = "auto"
TORCH = "torch"
TENSORFLOW = "tensorflow"
JAX = "jax"
NAMES = (TORCH, TENSORFLOW, JAX)

FrameworkChoice = Literal["auto", "torch", "tensorflow", "jax"]
"""`[trial] framework`: one of the frameworks, or `auto` (found from the entrypoint's imports)."""

REVEALED_BY: Mapping[str, str] = {
    "torch": TORCH,
    "torchvision": TORCH,
    "torchaudio": TORCH,
    "lightning": TORCH,
    "pytorch_lightning": TORCH,
    "trialq.lightning": TORCH,
    "tensorflow": TENSORFLOW,
    "tf_keras": TENSORFLOW,
    "trialq.keras": TENSORFLOW,
    "jax": JAX,
    "jaxlib": JAX,
    "flax": JAX,
    "optax": JAX,
    "equinox": JAX,
    "haiku": JAX,
}
"""An imported module (or any module under it) and the framework it means. `keras` is not
here: Keras 3 runs on the framework `KERAS_BACKEND` names (`keras_framework`)."""

PRELOAD: Mapping[str, tuple[str, ...]] = {
    TORCH: ("torch", "torch._dynamo"),
    TENSORFLOW: ("tensorflow",),
    JAX: ("jax",),
}
"""What a worker's parent imports for a framework's trials: the framework, and what its
first step imports anyway (PyTorch's first `optimizer.step()` imports `torch._dynamo` and
some 300 modules more: docs/frameworks.md, "Preloading")."""


def keras_framework(keras_backend: str | None) -> str:
    """The framework Keras 3 runs on: `KERAS_BACKEND`'s, TensorFlow when unset."""
    backend = (keras_backend or TENSORFLOW).strip().lower()
    return backend if backend in NAMES else TENSORFLOW


def framework_of(module: str, keras_backend: str | None = None) -> str | None:
    """The framework an imported module means, or None for any other module."""
    parts = module.split(".")
    if parts[0] == "keras":
        return keras_framework(keras_backend)
    for end in range(len(parts), 0, -1):
        found = REVEALED_BY.get(".".join(parts[:end]))
        if found is not None:
            return found
    return None


def imported_modules(source: str) -> Iterator[str]:
    """The absolute imports anywhere in `source` (inside functions too), in source order."""
    tree = ast.parse(source)
    nodes = sorted(
        (n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)),
        key=lambda n: (n.lineno, n.col_offset),
    )
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def framework_in_source(source: str | None, keras_backend: str | None = None) -> str | None:
    """The first framework `source` imports, or None (no framework, no source, or source
    that is not Python)."""
    if source is None:
        return None
    try:
        for module in imported_modules(source):
            found = framework_of(module, keras_backend)
            if found is not None:
                return found
    except (SyntaxError, ValueError):
        return None
    return None
