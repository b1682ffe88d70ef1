"""The framework seam: what trialq does for each framework around a trial, in three moments.

An `Adapter` (one module per framework: `pytorch`, `tensorflow`, `jax`, each registered by
its entry in `trialq.wire.frameworks.REGISTRY`) gives the variables to set before the
framework's runtime starts (`environment`), applies the trial's memory cap after the import
and before the first op (`cap`), reads the peaks per GPU after the trial (`peaks`) and what
its allocator holds now (`reserved`, for the GPU memory guard), frees what a try of
`fit_batch_size` left (`free_memory`), and says, without starting anything,
whether its runtime has started in this process (`started`) and whether that can be read at
all before the framework is imported (`guard_gap`): the worker parent's fork guard asks both.
No adapter imports its framework at module level: importing this package costs nothing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from trialq.gpu.share import GpuShare
from trialq.wire.frameworks import BY_NAME, NAMES

MIB = 2**20


@dataclass(frozen=True)
class Cap:
    """Whether a trial's memory cap holds, and why not where it does not."""

    applied: bool
    note: str | None = None
    settle: Callable[[], Cap] | None = field(default=None, compare=False)
    """For a cap the framework applies later, at its runtime's own start (PyTorch's): what
    it came to, asked after the trial."""

    def settled(self) -> Cap:
        """What the cap came to by now (itself, where it was applied at once)."""
        return self.settle() if self.settle is not None else self


class Adapter(Protocol):
    """What trialq does for one framework in a trial process."""

    name: str

    def environment(self, share: GpuShare | None, env: Mapping[str, str]) -> dict[str, str | None]:
        """Variables to set (None: to remove) before the runtime starts; `env` is the
        process's environment now (a variable the user set is theirs)."""

    def started(self) -> str | None:
        """Why this process holds the framework's device state (its runtime started), or
        None; never starts anything, never imports the framework."""

    def cap(self, share: GpuShare, environment_in_time: bool) -> Cap:
        """Hold the trial to `share.budget_bytes` on each of its GPUs, before its first op;
        `environment_in_time`: the variables were set before the runtime started."""

    def peaks(self) -> tuple[int, ...] | None:
        """The allocator's peak on each visible GPU, or None where there is none to read."""

    def reserved(self) -> tuple[int, ...] | None:
        """What the allocator holds now on each visible GPU, reserved and cached (() before
        its runtime started: nothing); None where the framework does not say it."""

    def free_memory(self, after_oom: bool) -> None:
        """Give back what the framework caches, where this process imported it (never
        imports it); `after_oom`: a try just ran out of memory (costlier clearing is due)."""

    def guard_gap(self) -> str | None:
        """Why `started` could not read an installed framework's state, found without
        importing it; None where it can, or where the framework is not installed."""


def adapter(name: str) -> Adapter:
    """The adapter of a framework trialq knows (`trialq.wire.frameworks.REGISTRY`)."""
    if name not in BY_NAME:
        raise ValueError(f"unknown framework {name!r}; known: {', '.join(NAMES)}")
    module = importlib.import_module(f"{__name__}.{BY_NAME[name].adapter_module}")
    found: Adapter = module.ADAPTER
    return found


def adapters() -> tuple[Adapter, ...]:
    """Every framework's adapter, in the registry's order (the fork guard asks each)."""
    return tuple(adapter(name) for name in NAMES)
