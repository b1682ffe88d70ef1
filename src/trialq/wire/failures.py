"""Turning what went wrong in a trial into an `Outcome` and a short error text.

Classification happens in the trial's process: exception classes do not cross JSON as
themselves, so the driver would see Celery's rebuilt class, not the framework's.

Out of memory is recognised by each framework's own exception types and messages (its
`OomSignature` in `trialq.wire.frameworks`; no framework is imported here: a type is known
by its name, its bases' included) and by CUDA's words, anywhere in the exception's chain:
Lightning, Keras and PyTorch's DataLoader re-raise an OOM as another exception, `raise ...
from` it or while handling it (`__cause__`, `__context__`).
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator

from trialq.wire.frameworks import REGISTRY, OomSignature
from trialq.wire.messages import Outcome

_CUDA_OOM_MESSAGES = (
    "out of memory",  # CUDA, PyTorch ("CUDA out of memory"), XLA ("Out of memory while ...")
    "cuda_error_out_of_memory",
    "cudnn_status_alloc_failed",
    "cublas_status_alloc_failed",
    "resource exhausted",
)
"""Any framework's on CUDA: the driver's and its libraries' own words."""
_OOM_MESSAGES = _CUDA_OOM_MESSAGES + tuple(m for f in REGISTRY for m in f.oom.messages)
_OOM_TYPE_NAMES = frozenset(name for f in REGISTRY for name in f.oom.types)
_CHAIN_LIMIT = 32
TRACEBACK_TAIL_LINES = 12


def classify(exc: BaseException) -> Outcome:
    """`oom` for any way a device or host runs out of memory, anywhere in the exception's
    chain, else `error`."""
    return Outcome.OOM if any(_is_oom(link) for link in chain(exc)) else Outcome.ERROR


def optuna_pruned(exc: BaseException) -> bool:
    """Whether `exc` is Optuna's `TrialPruned` (or a subclass): what code written for Optuna
    raises when it prunes, and a pruning like trialq's own. Known by its class's module and
    name, so Optuna is not imported in the trial's process."""
    return any(
        cls.__name__ == "TrialPruned" and cls.__module__.split(".")[0] == "optuna"
        for cls in type(exc).__mro__
    )


def chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what caused it or was being handled (`__cause__`, `__context__`) and the
    members of an exception group, each once, breadth first, at most `_CHAIN_LIMIT`."""
    seen: set[int] = set()
    queue = [exc]
    while queue and len(seen) < _CHAIN_LIMIT:
        link = queue.pop(0)
        if id(link) in seen:
            continue
        seen.add(id(link))
        yield link
        queue += [e for e in (link.__cause__, link.__context__) if e is not None]
        queue += list(
            getattr(link, "exceptions", ()) if isinstance(link, BaseExceptionGroup) else ()
        )


def _is_oom(exc: BaseException) -> bool:
    names = {cls.__name__ for cls in type(exc).__mro__}
    if isinstance(exc, MemoryError) or names & _OOM_TYPE_NAMES:
        return True
    message = str(exc).lower()
    if any(_has_status(f.oom, names, message) for f in REGISTRY):
        return True
    return any(sign in message for sign in _OOM_MESSAGES)


def _has_status(oom: OomSignature, names: set[str], message: str) -> bool:
    """A framework's error that is an OOM by the status it starts with (JAX's XLA status)."""
    return bool(oom.status and names & oom.status_types and message.lstrip().startswith(oom.status))


def headline(error: str | None) -> str | None:
    """The first line of an error text `describe` wrote (`Type: message`)."""
    return error.split("\n", 1)[0] if error else None


def describe(exc: BaseException) -> str:
    """`Type: message`, then the last lines of the traceback."""
    lines = traceback.format_exception(exc)
    tail = "".join(lines).splitlines()[-TRACEBACK_TAIL_LINES:]
    headline = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
    return headline + "\n" + "\n".join(tail)


def failure_line(number: int, outcome: str | None, error: str | None) -> str:
    """`#3 error: ZeroDivisionError: float division by zero`: why a trial failed, in a line."""
    return f"#{number} {outcome}: {headline(error) or 'no error text'}"
