"""What the private-hook tests (tests/unit/test_private_hooks_*.py) say when a hook is gone.

trialq leans on other projects' private names (docs/design.md, "Private hooks we lean on").
An upgrade that renames one must fail a test that names the hook, the trialq file that uses
it and what trialq loses without it, not silently cost speed or a safety guard.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Hook:
    """One private name of another project, as trialq uses it."""

    name: str
    """The library's name for it, e.g. `billiard.pool.Worker._ensure_messages_consumed`."""
    where: str
    """The trialq file that uses it."""
    loss: str
    """What trialq loses if it goes."""

    def gone(self, problem: str) -> str:
        """The failure message: the hook, where trialq uses it, what is wrong, what is lost."""
        return f"private hook {self.name} (used by {self.where}): {problem}; without it {self.loss}"


def parameters(function: Any) -> list[str]:
    """The names of a callable's parameters, `self` included."""
    return list(inspect.signature(function).parameters)


def refers_to(owner: Any, name: str) -> bool:
    """Whether any function of `owner` (a class's own functions, or a function), nested
    functions included, names `name`: how a library's call of a hook trialq overrides is seen."""
    return any(name in code.co_names for code in _codes(owner))


def _codes(owner: Any) -> Iterator[types.CodeType]:
    if isinstance(owner, type):
        functions = [inspect.unwrap(f) for f in vars(owner).values() if inspect.isfunction(f)]
    else:
        functions = [inspect.unwrap(owner)]
    for function in functions:
        yield from _nested(function.__code__)


def _nested(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _nested(const)
