"""Warm trial processes: the framework imported once in the worker's parent, never initialised.

Celery forks every trial's process from the worker's parent, so a trial starts with whatever
the parent has imported: importing TensorFlow there once saves every trial the seconds its
own import would cost. What must never cross a fork is device state (docs/design.md): a TensorFlow
runtime or a CUDA context made in the parent leaves forked children hanging. `device_in_use`
tells, without initialising anything itself, whether this process holds such state; the
worker asks it after preloading, in the parent before every fork, and in every new child.

TensorFlow's state is read from its private eager context (docs/design.md, "Private hooks we
lean on"). Where that cannot be done (a TensorFlow that renamed what is read, or a read that
fails), the guard fails closed: `device_in_use` takes the state for initialised, and `preload`
imports nothing in the parent (each trial imports its framework itself, a slower start).
"""

from __future__ import annotations

import ast
import functools
import gc
import importlib
import importlib.util
import logging
import os
import sys
from pathlib import Path

from trialq.errors import DeviceInParent, PreloadError

AUTO = "auto"
"""Preload TensorFlow when it is installed, nothing otherwise (the default)."""

NOTHING = "none"
"""Preload nothing: every trial imports its framework itself."""

_CUDA_DRIVER_FILE = "/dev/nvidia-uvm"
"""Opened by the CUDA driver when it initialises (cuInit), and not by NVML's queries."""

TF_CONTEXT_MODULE = "tensorflow.python.eager.context"
"""TensorFlow's eager context module, whose `context_safe()` returns the context, or None,
without creating one."""

TF_RUNTIME_HANDLE = "_context_handle"
"""The context's runtime: None until an op ran (or anything else initialised it)."""

TF_DEVICE_LIST = "_physical_devices"
"""The context's physical devices: None until listed (on a GPU build, listing inits CUDA)."""

logger = logging.getLogger("trialq.prewarm")


def preload_modules(choice: str) -> tuple[str, ...]:
    """The modules a `--preload` choice names: `auto`, `none`, or comma-separated names."""
    words = tuple(word.strip() for word in choice.split(",") if word.strip())
    if words in ((), (NOTHING,)):
        return ()
    if words == (AUTO,):
        return ("tensorflow",) if importlib.util.find_spec("tensorflow") else ()
    if AUTO in words or NOTHING in words:
        raise PreloadError(f"--preload: {AUTO!r} and {NOTHING!r} stand alone, got {choice!r}")
    return words


def preload(modules: tuple[str, ...]) -> None:
    """Import `modules` here, check they left no device state, then freeze the heap for forks.

    `gc.freeze()` moves everything imported so far out of the collector's sight: the parent's
    collection before each fork stops walking TensorFlow's objects (0.2 s a fork), and the
    children's collections stop writing to, and so copying, the pages they share.

    Where TensorFlow is installed but the guard could not read its state
    (`tensorflow_guard_gap`), nothing is imported: any of `modules` may import TensorFlow.
    One warning line says so.
    """
    _quiet_tensorflow_logs()
    gap = tensorflow_guard_gap() if modules and "tensorflow" not in sys.modules else None
    if gap is not None:
        _warn_preloading_nothing(modules, gap)
        modules = ()
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise PreloadError(f"--preload {name}: {type(exc).__name__}: {exc}") from None
    reason = device_in_use()
    if reason is not None:
        raise DeviceInParent(
            f"--preload {','.join(modules)}: {reason} in the worker's parent; forked trials "
            "would hang. Preload modules that only import their framework."
        )
    gc.collect()
    gc.freeze()


def device_in_use(fd_dir: Path = Path("/proc/self/fd")) -> str | None:
    """Why this process may not fork trials (it initialised a device), or None if it may."""
    tensorflow = _tensorflow_runtime_state()
    if tensorflow is not None:
        return tensorflow
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "PyTorch initialised CUDA"
    if _holds_file(fd_dir, _CUDA_DRIVER_FILE):
        return f"the CUDA driver was initialised ({_CUDA_DRIVER_FILE} is open)"
    return None


def _tensorflow_runtime_state() -> str | None:
    """TensorFlow's eager context, read without creating it (context_safe); where it cannot
    be read, TensorFlow is taken as initialised (fail closed)."""
    if "tensorflow" not in sys.modules and TF_CONTEXT_MODULE not in sys.modules:
        return None
    try:
        return tensorflow_context_state(sys.modules[TF_CONTEXT_MODULE].context_safe())
    except Exception as exc:
        return f"TensorFlow's state cannot be checked ({_described(exc)}), so taken as initialised"


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
    """Why `device_in_use` could not read an installed TensorFlow's state, found in its source
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
        return f"its {TF_CONTEXT_MODULE} cannot be read: {_described(exc)}"
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


_warned = False


def _warn_preloading_nothing(modules: tuple[str, ...], gap: str) -> None:
    """One line, once a process (`trialq worker` preloads before Celery does it again)."""
    global _warned
    if not _warned:
        _warned = True
        logger.warning(
            "not preloading %s: trialq cannot check this TensorFlow for device state in the "
            "worker's parent (%s); each trial imports its framework itself",
            ",".join(modules),
            gap,
        )


def _described(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _holds_file(fd_dir: Path, target: str) -> bool:
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return False
    for name in names:
        try:
            if os.readlink(fd_dir / name) == target:
                return True
        except OSError:
            continue  # closed since the listing
    return False


def _quiet_tensorflow_logs() -> None:
    """TensorFlow's C++ start-up chatter would otherwise fill every worker log."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
