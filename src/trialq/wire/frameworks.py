"""The frameworks trialq knows: one `Framework` descriptor each, one entry of `REGISTRY`.

A descriptor says, by names only, what the driver and the wire need of a framework: the
imports that reveal it in an entrypoint's source, what a worker preloads for it, how its
out-of-memory errors look, and which module of `trialq.trial.frameworks` holds its adapter
(what runs in a trial process: environment, cap, peaks, fork guard, freeing memory). Nothing
here imports a framework or the trial side, so the driver (`submit-study --local` picks its
workers' preload from the spec), the wire (`trialq.wire.failures`) and a trial process
(`[trial] framework = "auto"`, decided before the entrypoint is imported) share one table.

Adding a framework: its adapter module under `trialq/trial/frameworks/`, and its entry here
(docs/frameworks.md; tests/unit/test_framework_registry.py checks each says all it must)."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Annotated

from pydantic import AfterValidator

from trialq.wire.entrypoint_uses import modules_used


@dataclass(frozen=True)
class OomSignature:
    """How a framework's out-of-memory errors are known, by names (its types are never
    imported here): a type's name (its bases' included), a text in the message, or a type
    that is an OOM only with a status at the front of its message."""

    types: frozenset[str] = frozenset()
    messages: tuple[str, ...] = ()
    """Lower case, found anywhere in the message."""
    status_types: frozenset[str] = frozenset()
    status: str = ""
    """Lower case, at the front of a `status_types` message."""


@dataclass(frozen=True)
class Framework:
    """What the driver and the wire know of one framework."""

    name: str
    """Its name in the spec (`[trial] framework`), which is also its top-level module."""
    adapter_module: str
    """The module of `trialq.trial.frameworks` that holds its `ADAPTER`."""
    revealed_by: tuple[str, ...]
    """Imported modules (or any module under them) that mean this framework."""
    preload: tuple[str, ...]
    """What a worker's parent imports for its trials: the framework, and what its first
    step imports anyway (docs/frameworks.md, "Preloading")."""
    oom: OomSignature


REGISTRY: tuple[Framework, ...] = (
    Framework(
        name="torch",
        adapter_module="pytorch",
        revealed_by=("torch", "torchvision", "torchaudio", "lightning", "pytorch_lightning",
                     "trialq.lightning"),
        preload=("torch", "torch._dynamo"),
        oom=OomSignature(types=frozenset({"OutOfMemoryError"})),
    ),
    Framework(
        name="tensorflow",
        adapter_module="tensorflow",
        revealed_by=("tensorflow", "tf_keras", "trialq.keras"),
        preload=("tensorflow",),
        oom=OomSignature(types=frozenset({"ResourceExhaustedError"}),
                         messages=("oom when allocating",)),
    ),
    Framework(
        name="jax",
        adapter_module="jax",
        revealed_by=("jax", "jaxlib", "flax", "optax", "equinox", "haiku"),
        preload=("jax",),
        oom=OomSignature(status_types=frozenset({"JaxRuntimeError", "XlaRuntimeError"}),
                         status="resource_exhausted"),
    ),
)  # fmt: skip
"""Every framework trialq prepares a trial for, one entry each, in the order the fork guard
asks them. PyTorch's first `optimizer.step()` imports `torch._dynamo` and some 300 modules
more; `torch.OutOfMemoryError` is `torch.cuda.OutOfMemoryError`; JAX's runtime error
(`XlaRuntimeError` before 0.5) is an OOM only with XLA's `RESOURCE_EXHAUSTED` status."""

AUTO = "auto"
TENSORFLOW = "tensorflow"
NAMES = tuple(framework.name for framework in REGISTRY)
BY_NAME: Mapping[str, Framework] = {framework.name: framework for framework in REGISTRY}


def _known(choice: str) -> str:
    """`auto` or a registered name; else the line a spec's wrong choice always had."""
    if choice != AUTO and choice not in BY_NAME:
        choices = [repr(name) for name in (AUTO, *NAMES)]
        expected = f"{', '.join(choices[:-1])} or {choices[-1]}"
        raise ValueError(f"Input should be {expected} (got {choice!r})")
    return choice


FrameworkChoice = Annotated[str, AfterValidator(_known)]
"""`[trial] framework`: one of the frameworks, or `auto` (found from the entrypoint's imports)."""

REVEALED_BY: Mapping[str, str] = {
    module: framework.name for framework in REGISTRY for module in framework.revealed_by
}
"""An imported module (or any module under it) and the framework it means. `keras` is not
here: Keras 3 runs on the framework `KERAS_BACKEND` names (`keras_framework`)."""

PRELOAD: Mapping[str, tuple[str, ...]] = {
    framework.name: framework.preload for framework in REGISTRY
}
"""What a worker's parent imports for a framework's trials."""


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


def framework_in_source(
    source: str | None, keras_backend: str | None = None, function: str | None = None
) -> str | None:
    """The first framework `function` of the module `source` uses (`entrypoint_uses`), or
    without `function` the first the module imports anywhere; None where none is found (no
    framework, no source, or source that is not Python)."""
    if source is None:
        return None
    try:
        modules = imported_modules(source) if function is None else modules_used(source, function)
        for module in modules:
            found = framework_of(module, keras_backend)
            if found is not None:
                return found
    except (SyntaxError, ValueError):
        return None
    return None
