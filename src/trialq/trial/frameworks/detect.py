"""Which framework a trial uses, for `[trial] framework = "auto"`.

First from the entrypoint's source, before it is imported (so the framework's environment
is set before its import): the first framework the entrypoint function uses, by itself or
through what it calls in its module (`trialq.wire.entrypoint_uses`). Where that names none
(it reaches the framework through a module of its own), from
what its import loaded, or failing that, from the one framework this process holds (the
worker preloaded it): then the environment comes after the import, still in time unless the
import started the framework's runtime, which the trial records.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Set

from trialq.wire.frameworks import framework_in_source, framework_of

KERAS_BACKEND = "KERAS_BACKEND"


def in_source(source: str | None, function: str, env: Mapping[str, str]) -> str | None:
    """The first framework the entrypoint `function` of the module `source` uses, or None."""
    return framework_in_source(source, env.get(KERAS_BACKEND), function) if source else None


def loaded(before: Set[str], env: Mapping[str, str]) -> str | None:
    """The framework the entrypoint's import loaded, else the only one this process holds."""
    modules = set(sys.modules)
    return _only(modules - before, env) or _only(modules, env)


def _only(modules: Iterable[str], env: Mapping[str, str]) -> str | None:
    """The one framework among `modules` (top-level names, and trialq's own helpers)."""
    found = {
        framework_of(name, env.get(KERAS_BACKEND))
        for name in modules
        if "." not in name or name.startswith("trialq.")
    }
    found.discard(None)
    return found.pop() if len(found) == 1 else None
