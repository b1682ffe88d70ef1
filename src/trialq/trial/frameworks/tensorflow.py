"""TensorFlow: memory growth before its GPUs start, a logical device with a memory limit on
each GPU after the import, and the allocator's peak per GPU after the trial.

Its runtime state is read from its private eager context without creating one (docs/design.md,
"Private hooks we lean on"); where that cannot be done the state is taken as started (the fork
guard fails closed). `tensorflow_guard_gap` finds the names in TensorFlow's source before it
is imported, so a worker knows before preloading it.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trialq.gpu.share import GpuShare
from trialq.trial.frameworks import MIB, Cap

GROWTH = "TF_FORCE_GPU_ALLOW_GROWTH"
"""Memory taken as it is needed, up to the logical device's limit where one is set."""

TF_CONTEXT_MODULE = "tensorflow.python.eager.context"
"""TensorFlow's eager context module, whose `context_safe()` returns the context, or None,
without creating one."""

TF_RUNTIME_HANDLE = "_context_handle"
"""The context's runtime: None until an op ran (or anything else initialised it)."""

TF_DEVICE_LIST = "_physical_devices"
"""The context's physical devices: None until listed (on a GPU build, listing inits CUDA)."""


class TensorFlow:
    """The adapter for trials that use TensorFlow (Keras on TensorFlow included)."""

    name = "tensorflow"

    def environment(self, share: GpuShare | None, env: Mapping[str, str]) -> dict[str, str | None]:
        """Growth (unless the user chose), and quiet C++ start-up logs."""
        wanted = {GROWTH: "true", "TF_CPP_MIN_LOG_LEVEL": "2"}
        return {name: value for name, value in wanted.items() if name not in env}

    def started(self) -> str | None:
        """TensorFlow's eager context, read without creating it; unreadable: started."""
        if "tensorflow" not in sys.modules and TF_CONTEXT_MODULE not in sys.modules:
            return None
        try:
            return tensorflow_context_state(sys.modules[TF_CONTEXT_MODULE].context_safe())
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            return f"TensorFlow's state cannot be checked ({why}), so taken as initialised"

    def cap(self, share: GpuShare, environment_in_time: bool) -> Cap:
        """One logical device of `budget` MiB on each GPU TensorFlow sees."""
        if share.budget_bytes is None:
            return Cap(False, "no GPU budget: the trial may use its whole GPUs")
        import tensorflow as tf

        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            return Cap(False, "TensorFlow sees no GPU")
        limit = tf.config.LogicalDeviceConfiguration(memory_limit=share.budget_bytes // MIB)
        try:
            for gpu in gpus:
                tf.config.set_logical_device_configuration(gpu, [limit])
        except (RuntimeError, ValueError) as exc:
            return Cap(False, f"TensorFlow's runtime started before the cap: {exc}")
        return Cap(True)

    def free_memory(self, after_oom: bool) -> None:
        """Nothing: TensorFlow never hands memory back inside a process."""

    def guard_gap(self) -> str | None:
        """Whether its private context names are there (`tensorflow_guard_gap`)."""
        return tensorflow_guard_gap()

    def reserved(self) -> tuple[int, ...] | None:
        """None once its runtime ran: `get_memory_info` says what is in use, not the BFC
        allocator's regions, so no growth outside it can be named; () before."""
        return None if self.started() is not None else ()

    def peaks(self) -> tuple[int, ...] | None:
        """`get_memory_info('GPU:i')['peak']` per GPU, once TensorFlow's runtime ran."""
        tf = sys.modules.get("tensorflow")
        if tf is None or self.started() is None:
            return None
        try:
            gpus = tf.config.list_logical_devices("GPU")
            return tuple(_peak(tf, gpu.name) for gpu in gpus) or None
        except (RuntimeError, ValueError, AttributeError):
            return None


def _peak(tf: Any, device: str) -> int:
    return int(tf.config.experimental.get_memory_info(device)["peak"])


def tensorflow_context_state(context: object) -> str | None:
    """What TensorFlow's eager context `context` (or None: no context yet) has initialised;
    raises AttributeError where it lacks what is read."""
    if context is None:
        return None
    if getattr(context, TF_RUNTIME_HANDLE) is not None:
        return "TensorFlow's runtime was initialised (an op ran)"
    if getattr(context, TF_DEVICE_LIST) is not None:
        return "TensorFlow listed the physical devices (on a GPU build this initialises CUDA)"
    return None


@functools.cache
def tensorflow_guard_gap() -> str | None:
    """Why the fork guard could not read an installed TensorFlow's state, found in its source
    without importing it; None where it can, or where TensorFlow is not installed.

    Read once: the answer holds for as long as the process runs.
    """
    try:
        spec = importlib.util.find_spec("tensorflow")
        if spec is None:
            return None
        package = Path(next(iter(spec.submodule_search_locations or ())))
        *folders, name = TF_CONTEXT_MODULE.split(".")[1:]
        source = package.joinpath(*folders, f"{name}.py")
        tree = ast.parse(source.read_bytes(), str(source))
    except Exception as exc:
        return f"its {TF_CONTEXT_MODULE} cannot be read: {type(exc).__name__}: {exc}"
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assigned = {
        attribute
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name == "Context"
        for attribute in _set_on_self(node)
    }
    missing = [] if "context_safe" in functions else [f"{TF_CONTEXT_MODULE}.context_safe"]
    missing += [f"Context.{a}" for a in (TF_RUNTIME_HANDLE, TF_DEVICE_LIST) if a not in assigned]
    return f"it has no {', no '.join(missing)}" if missing else None


def _set_on_self(cls: ast.ClassDef) -> set[str]:
    """The attributes that a class's methods assign to `self`."""
    names: set[str] = set()
    for node in ast.walk(cls):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        for target in targets:
            names.update(
                part.attr
                for part in ast.walk(target)
                if isinstance(part, ast.Attribute)
                and isinstance(part.value, ast.Name)
                and part.value.id == "self"
            )
    return names


ADAPTER = TensorFlow()
