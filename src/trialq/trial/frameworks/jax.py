"""JAX: no preallocation and a memory fraction, both in the environment before its backends
start (that is its cap); the allocator's peak per GPU after the trial.

By default JAX takes 75 % of each GPU at its first op, so two JAX trials cannot share one.
`XLA_PYTHON_CLIENT_PREALLOCATE=false` makes it allocate as it goes, and the memory fraction
bounds what its allocator may hold. jaxlib reads the fraction when its GPU backend starts
(`jaxlib.xla_client.generate_pjrt_gpu_plugin_options`): as `XLA_CLIENT_MEM_FRACTION` since
it was renamed, as `XLA_PYTHON_CLIENT_MEM_FRACTION` before. jaxlib 0.10 refuses both at once
(ValueError), so trialq sets the name the installed jaxlib reads and removes the other.

Whether the backends have started is read from `jax._src.xla_bridge.backends_are_initialized`
(private: pinned by tests/unit/test_private_hooks_jax.py); where it cannot be read, taken as
started (the fork guard fails closed).
"""

from __future__ import annotations

import functools
import importlib.util
import math
import pkgutil
import sys
from collections.abc import Mapping
from pathlib import Path

from trialq.gpu.share import GpuShare
from trialq.trial.frameworks import Cap

PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
FRACTION = "XLA_CLIENT_MEM_FRACTION"
"""The fraction's name since jaxlib renamed it."""
FRACTION_OLD = "XLA_PYTHON_CLIENT_MEM_FRACTION"
"""The name older jaxlibs read (deprecated where the new one is known)."""

BRIDGE_MODULE = "jax._src.xla_bridge"
BACKENDS_STARTED = "backends_are_initialized"


class Jax:
    """The adapter for trials that use JAX (Flax, Optax, Equinox included)."""

    name = "jax"

    def environment(self, share: GpuShare | None, env: Mapping[str, str]) -> dict[str, str | None]:
        """No preallocation (unless the user chose), and the budget as a memory fraction
        (rounded down, so it never exceeds the budget)."""
        settings: dict[str, str | None] = {} if PREALLOCATE in env else {PREALLOCATE: "false"}
        fraction = memory_fraction(share)
        if fraction is not None:
            name, other = fraction_names()
            settings.update({name: f"{math.floor(fraction * 1e4) / 1e4:.4f}", other: None})
        return settings

    def started(self) -> str | None:
        """JAX's backends, read without starting them; unreadable: started."""
        if BRIDGE_MODULE not in sys.modules:
            return None
        try:
            started = getattr(sys.modules[BRIDGE_MODULE], BACKENDS_STARTED)()
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
            return f"JAX's state cannot be checked ({why}), so taken as initialised"
        return "JAX initialised its backends (an op ran)" if started else None

    def cap(self, share: GpuShare, environment_in_time: bool) -> Cap:
        """Nothing to call: the fraction set before the backends started is the cap."""
        if memory_fraction(share) is None:
            missing = "budget" if share.budget_bytes is None else "device total"
            return Cap(False, f"no GPU {missing} known: the fraction was not set")
        if not environment_in_time:
            return Cap(False, "JAX started its backends before trialq set its memory fraction")
        if not cuda_plugins():
            return Cap(False, "JAX has no CUDA plugin installed (jax_plugins.xla_cuda*)")
        return Cap(True)

    def peaks(self) -> tuple[int, ...] | None:
        """`memory_stats()['peak_bytes_in_use']` per GPU, once the backends started."""
        if self.started() is None or "jax" not in sys.modules:
            return None
        try:
            devices = sys.modules["jax"].local_devices(backend="gpu")
        except RuntimeError:  # no GPU backend
            return None
        stats = [device.memory_stats() or {} for device in devices]
        return tuple(int(s.get("peak_bytes_in_use", 0)) for s in stats) or None

    def reserved(self) -> tuple[int, ...] | None:
        """`memory_stats()['pool_bytes']` per GPU (the BFC allocator's pool: all of it where
        XLA preallocates); () before the backends started; None where a GPU has no such key."""
        if self.started() is None or "jax" not in sys.modules:
            return ()
        try:
            devices = sys.modules["jax"].local_devices(backend="gpu")
        except RuntimeError:  # no GPU backend
            return ()
        pools = [(device.memory_stats() or {}).get("pool_bytes") for device in devices]
        if any(pool is None for pool in pools):
            return None
        return tuple(int(pool) for pool in pools if pool is not None)

    def free_memory(self, after_oom: bool) -> None:
        """After an OOM, JAX's compilation caches (a cleared cache recompiles every op:
        seconds on a CPU, so only then)."""
        jax = sys.modules.get("jax")
        if after_oom and jax is not None and hasattr(jax, "clear_caches"):
            jax.clear_caches()

    def guard_gap(self) -> str | None:
        """Whether its private bridge function is there (`jax_guard_gap`)."""
        return jax_guard_gap()


def memory_fraction(share: GpuShare | None) -> float | None:
    """The budget as a fraction of the device, or None without both."""
    if share is None or share.budget_bytes is None or not share.total_bytes:
        return None
    return min(1.0, share.budget_bytes / share.total_bytes)


def cuda_plugins() -> list[str]:
    """JAX's CUDA plugins installed here (`jax[cuda12]` installs `jax_plugins.xla_cuda12`),
    found without importing them: without one, JAX runs on the CPU and nothing is capped."""
    spec = importlib.util.find_spec("jax_plugins")
    if spec is None or not spec.submodule_search_locations:
        return []
    found = pkgutil.iter_modules(list(spec.submodule_search_locations))
    return [module.name for module in found if module.name.startswith("xla_cuda")]


@functools.cache
def fraction_names() -> tuple[str, str]:
    """(the name to set, the name to remove): the new name where the installed jaxlib's
    source knows it, else the old one."""
    try:
        spec = importlib.util.find_spec("jaxlib")
        folder = Path(next(iter(spec.submodule_search_locations or ()))) if spec else None
        known = folder is not None and FRACTION in (folder / "xla_client.py").read_text()
    except (OSError, StopIteration, ValueError):
        known = False
    return (FRACTION, FRACTION_OLD) if known else (FRACTION_OLD, FRACTION)


ADAPTER = Jax()


@functools.cache
def jax_guard_gap() -> str | None:
    """Why the fork guard could not read an installed JAX's state, found in its source
    without importing it; None where it can, or where JAX is not installed."""
    try:
        spec = importlib.util.find_spec("jax")
        if spec is None:
            return None
        package = Path(next(iter(spec.submodule_search_locations or ())))
        source = package.joinpath(*BRIDGE_MODULE.split(".")[1:]).with_suffix(".py").read_text()
    except (OSError, StopIteration, ValueError) as exc:
        return f"its {BRIDGE_MODULE} cannot be read: {type(exc).__name__}: {exc}"
    found = f"def {BACKENDS_STARTED}(" in source
    return None if found else f"it has no {BRIDGE_MODULE}.{BACKENDS_STARTED}()"
