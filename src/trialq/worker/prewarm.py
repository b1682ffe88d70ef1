"""Warm trial processes: the framework imported once in the worker's parent, never initialised.

Celery forks every trial's process from the worker's parent, so a trial starts with whatever
the parent has imported: importing the study's framework there once saves every trial the
seconds its own import would cost (docs/frameworks.md, "Preloading"). What must never cross a
fork is device state (docs/design.md): a TensorFlow runtime, JAX's backends or a CUDA context
made in the parent leaves forked children hanging or broken. `device_in_use` tells, without
initialising anything itself, whether this process holds such state, asking each framework's
adapter (`trialq.trial.frameworks`); the worker asks it after preloading, in the parent
before every fork, and in every new child.

`auto` preloads the frameworks the worker's image has: the one of PyTorch, TensorFlow and JAX
that is installed; where several are, those safe to import together without a device
(`TOGETHER`: PyTorch and JAX), never TensorFlow beside another (one line says so: name the
modules in `TRIALQ_PRELOAD`, as `submit-study --local` does from the spec). Besides, what an
entrypoint module imports at its top (`trialq.worker.preload_from`: scikit-learn, pandas...)
is preloaded as `optional` modules: one that fails to import is left out, not fatal.
`preload` returns what it imported and what it left out, for the worker's ready line.

TensorFlow's and JAX's states are read from private names (docs/design.md, "Private hooks we
lean on"). Where that cannot be done (a release that renamed what is read, or a read that
fails), the guard fails closed: `device_in_use` takes the state for initialised, and `preload`
imports nothing in the parent (each trial imports its framework itself, a slower start).
"""

from __future__ import annotations

import gc
import importlib
import importlib.util
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from trialq.errors import DeviceInParent, PreloadError
from trialq.trial.frameworks import adapters
from trialq.trial.frameworks.tensorflow import TF_CONTEXT_MODULE
from trialq.wire.frameworks import NAMES, PRELOAD
from trialq.worker.preload_from import PreloadFrom, preload_from

AUTO = "auto"
"""Preload the framework installed here, when exactly one of them is (the default)."""

NOTHING = "none"
"""Preload nothing: every trial imports its framework itself."""

_CUDA_DRIVER_FILE = "/dev/nvidia-uvm"
"""Opened by the CUDA driver when it initialises (cuInit), and not by NVML's queries."""

TOGETHER = ("torch", "jax")
"""Frameworks `auto` preloads side by side where several are installed: each imports without
starting a device (the guard reads both). TensorFlow is left out beside another: 4-7 s and
~600 MB a worker for studies that may never use it, and its libraries clash with others'."""

__all__ = ["TF_CONTEXT_MODULE", "Preloaded", "device_in_use", "preload", "preload_modules"]


@dataclass(frozen=True)
class Preloaded:
    """What a worker's parent imported for its trials, and what it left out, each with why."""

    modules: tuple[str, ...] = ()
    left_out: tuple[str, ...] = ()

    def line(self) -> str:
        """`preloaded: torch, sklearn.ensemble; left out: helpers (your own module: ...)`."""
        shown = ", ".join(self.modules) or "nothing"
        return shown if not self.left_out else f"{shown}; left out: {', '.join(self.left_out)}"


logger = logging.getLogger("trialq.prewarm")


def preload_for(
    choice: str, entrypoint: str | None = None, import_paths: tuple[str, ...] = ()
) -> Preloaded:
    """A worker's preload: `choice` (`--preload`), and what `entrypoint`'s module imports
    at its top (`--preload-from`)."""
    left_out = auto_left_out() if choice.strip() == AUTO else ()
    found = preload_from(entrypoint, import_paths) if entrypoint else PreloadFrom()
    return preload(preload_modules(choice), found.modules, (*left_out, *found.left_out))


def preload_modules(choice: str) -> tuple[str, ...]:
    """The modules a `--preload` choice names: `auto`, `none`, or comma-separated names."""
    words = tuple(word.strip() for word in choice.split(",") if word.strip())
    if words in ((), (NOTHING,)):
        return ()
    if words == (AUTO,):
        return installed_framework_modules()
    if AUTO in words or NOTHING in words:
        raise PreloadError(f"--preload: {AUTO!r} and {NOTHING!r} stand alone, got {choice!r}")
    return words


def preload(
    modules: tuple[str, ...], optional: tuple[str, ...] = (), left_out: tuple[str, ...] = ()
) -> Preloaded:
    """Import `modules` here, and of `optional` those that import (the others left out,
    with why, after `left_out`), check they left no device state, then freeze the heap for
    forks; what was imported and left out.

    `gc.freeze()` moves everything imported so far out of the collector's sight: the parent's
    collection before each fork stops walking the framework's objects (0.2 s a fork with
    TensorFlow), and the children's collections stop writing to, and so copying, the pages
    they share.

    Where a framework is installed but the guard could not read its state (`guard_gap`),
    nothing is imported: any of `modules` may import it. One warning line says so.
    """
    _quiet_tensorflow_logs()
    modules = _installed_only(modules)
    optional = tuple(name for name in optional if name not in modules)
    gap = guard_gap() if modules or optional else None
    if gap is not None:
        _warn_preloading_nothing((*modules, *optional), gap)
        skipped = tuple(f"{name} (the fork guard cannot read {gap})" for name in optional)
        modules, optional, left_out = (), (), (*left_out, *skipped)
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise PreloadError(f"--preload {name}: {type(exc).__name__}: {exc}") from None
        _check_no_device(name)
    imported, failed = _import_optional(optional)
    gc.collect()
    gc.freeze()
    return Preloaded((*modules, *imported), (*left_out, *failed))


def _import_optional(names: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Those of `names` that import here, and the others, each with its error."""
    imported: list[str] = []
    failed: list[str] = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:
            failed.append(f"{name} (import failed: {type(exc).__name__}: {exc})")
            continue
        _check_no_device(name)
        imported.append(name)
    return tuple(imported), tuple(failed)


def _check_no_device(name: str) -> None:
    """Refuse, naming the module, a preload that started a device in the parent."""
    reason = device_in_use()
    if reason is not None:
        raise DeviceInParent(
            f"--preload {name}: {reason} in the worker's parent; forked trials would hang. "
            "Preload modules that only import their framework."
        )


def _installed_only(modules: tuple[str, ...]) -> tuple[str, ...]:
    """`modules` less those of a framework that is not installed here (one warning line):
    a framework one image lacks never stops its worker; its trials fail or run as they would
    without a preload. A missing module of any other name is still the caller's mistake."""
    missing = [name for name in modules if not _framework_installed(name.split(".")[0])]
    if missing:
        logger.warning("--preload: %s not installed here, so not preloaded", ", ".join(missing))
    return tuple(name for name in modules if name not in missing)


def _framework_installed(top: str) -> bool:
    """False only for a framework trialq knows whose package is absent."""
    return top not in NAMES or importlib.util.find_spec(top) is not None


def device_in_use(fd_dir: Path = Path("/proc/self/fd")) -> str | None:
    """Why this process may not fork trials (it initialised a device), or None if it may."""
    for framework in adapters():
        reason = framework.started()
        if reason is not None:
            return reason
    if _holds_file(fd_dir, _CUDA_DRIVER_FILE):
        return f"the CUDA driver was initialised ({_CUDA_DRIVER_FILE} is open)"
    return None


def installed_framework_modules() -> tuple[str, ...]:
    """What `auto` preloads: the modules of the one framework installed here; of several,
    those of `TOGETHER` (`auto_left_out` says what is not)."""
    installed = [name for name in NAMES if importlib.util.find_spec(name) is not None]
    if len(installed) == 1:
        return PRELOAD[installed[0]]
    return tuple(module for name in installed if name in TOGETHER for module in PRELOAD[name])


def auto_left_out() -> tuple[str, ...]:
    """The frameworks installed here that `auto` does not preload, each with why."""
    installed = [name for name in NAMES if importlib.util.find_spec(name) is not None]
    if len(installed) < 2:
        return ()
    why = "not beside another framework: name it in TRIALQ_PRELOAD for its studies"
    return tuple(f"{name} ({why})" for name in installed if name not in TOGETHER)


def guard_gap() -> str | None:
    """Why the fork guard cannot read an installed framework that is not imported yet, or None.

    Found in the framework's source, without importing it; TensorFlow's and JAX's states are
    read from private names, PyTorch's through its public `torch.cuda.is_initialized()`.
    """
    for framework in adapters():
        gap = framework.guard_gap() if framework.name not in sys.modules else None
        if gap is not None:
            return f"{framework.name}: {gap}"
    return None


_warned = False


def _warn_preloading_nothing(modules: tuple[str, ...], gap: str) -> None:
    """One line, once a process (`trialq worker` preloads before Celery does it again)."""
    global _warned
    if not _warned:
        _warned = True
        logger.warning(
            "not preloading %s: trialq cannot check a framework installed here for device "
            "state in the worker's parent (%s); each trial imports its framework itself",
            ",".join(modules),
            gap,
        )


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
