"""Warm trial processes: the framework imported once in the worker's parent, never initialised.

Celery forks every trial's process from the worker's parent, so a trial starts with whatever
the parent has imported: importing TensorFlow there once saves every trial the seconds its
own import would cost. What must never cross a fork is device state (docs/design.md): a TensorFlow
runtime or a CUDA context made in the parent leaves forked children hanging. `device_in_use`
tells, without initialising anything itself, whether this process holds such state; the
worker asks it after preloading, in the parent before every fork, and in every new child.
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
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
    """
    _quiet_tensorflow_logs()
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
    """TensorFlow's eager context, read without creating it (context_safe)."""
    context_module = sys.modules.get("tensorflow.python.eager.context")
    if context_module is None:
        return None
    context = context_module.context_safe()
    if context is None:
        return None
    if getattr(context, "_context_handle", None) is not None:
        return "TensorFlow's runtime was initialised (an op ran)"
    if getattr(context, "_physical_devices", None) is not None:
        return "TensorFlow listed the physical devices (on a GPU build this initialises CUDA)"
    return None


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
