"""`trial.fit_batch_size`: the largest batch that fits the trial's own GPU budget, found in
the trial's process (PyTorch, JAX).

As Lightning's `BatchSizeFinder` (mode `binsearch`): double from `start` until a try runs out
of memory or reaches `maximum`, then bisect between the last size that fitted and the first
that did not. The search (`search`, pure: it sees only whether a size fitted) is apart from
the doing (`fit`: calls the trial's try, tells an out-of-memory error from any other, and
frees what a try left between tries: garbage collection, PyTorch's cached blocks, JAX's
compiled executables). Under a per-trial cap (`set_per_process_memory_fraction`, JAX's memory
fraction), a try that goes past the trial's budget fails as an OOM even when the device has
room: the answer is what fits this trial's share, not the whole card.

Keras is not here: TensorFlow never hands memory back inside a process, and a failed
allocation can leave its allocator fragmented (docs/frameworks/keras.md).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from trialq.trial.frameworks import adapters
from trialq.wire import failures
from trialq.wire.messages import Outcome

_log = logging.getLogger("trialq.batch_size")

MAX_TRIES = 25
"""Lightning's default `max_trials`: far more than doubling and bisecting up to 2**20 take."""


class NoBatchSizeFits(MemoryError):
    """Not even a batch of one fits: the trial ends `oom` (a `MemoryError`), so that
    `oom_as_constraint` teaches the sampler that these params do not fit."""


@dataclass(frozen=True)
class Found:
    """What a search found: the largest size that fitted (None: not even 1), every try."""

    size: int | None
    tries: tuple[tuple[int, bool], ...]


def search(fits: Callable[[int], bool], start: int, maximum: int, max_tries: int) -> Found:
    """Double from `start` until a size does not fit or `maximum` is reached, then bisect
    between the largest size that fitted and the smallest that did not. Pure but for `fits`."""
    if start < 1 or maximum < 1:
        raise ValueError(f"batch sizes start at 1: start={start}, maximum={maximum}")
    fitted, failed = 0, None
    size: int | None = min(start, maximum)
    tries: list[tuple[int, bool]] = []
    while size is not None and len(tries) < max_tries:
        ok = fits(size)
        tries.append((size, ok))
        fitted, failed = (size, failed) if ok else (fitted, size)
        size = _next_size(fitted, failed, maximum)
    return Found(fitted or None, tuple(tries))


def _next_size(fitted: int, failed: int | None, maximum: int) -> int | None:
    """The next size to try, or None when the boundary is found."""
    if failed is None:
        return min(fitted * 2, maximum) if fitted < maximum else None
    return (fitted + failed) // 2 if failed - fitted > 1 else None


def fit(
    try_batch: Callable[[int], object],
    *,
    start: int,
    maximum: int,
    max_tries: int = MAX_TRIES,
    margin: float = 0.0,
) -> int:
    """The largest batch size for which `try_batch(size)` ran without running out of memory,
    less `margin` (a fraction kept free, as Lightning's); any other error is raised as is.

    `try_batch` should do what a training step at that size does (forward, backward, the
    optimizer's step) and keep nothing: what it leaves referenced stays allocated.
    """
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin is a fraction in [0, 1): {margin}")
    last_oom: list[str] = []
    found = search(_fits(try_batch, last_oom), start, maximum, max_tries)
    _log.info("batch sizes tried %s: %s fits", list(found.tries), found.size)
    if found.size is None:
        raise NoBatchSizeFits(f"not even a batch of 1 fits: {last_oom[-1] if last_oom else ''}")
    return max(1, int(found.size * (1.0 - margin)))


def _fits(try_batch: Callable[[int], object], last_oom: list[str]) -> Callable[[int], bool]:
    """`try_batch` as the search's question: False on an OOM (its text kept), memory freed."""

    def fits(size: int) -> bool:
        try:
            try_batch(size)
            ok = True
        except Exception as exc:
            if not is_oom(exc):
                raise
            last_oom.append(f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
            ok = False
        free_memory(after_oom=not ok)  # out of the except block: the try's frames are gone
        return ok

    return fits


def is_oom(exc: BaseException) -> bool:
    """Whether `exc`, or an error it was raised from or during, is an out-of-memory error.

    `failures.classify` decides; the walk along `__cause__`/`__context__` and JAX's
    `RESOURCE_EXHAUSTED` are here only until `classify` reads them itself.
    """
    return any(
        failures.classify(link) is Outcome.OOM or "RESOURCE_EXHAUSTED" in str(link)
        for link in _chain(exc)
    )


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or link.__context__


def free_memory(after_oom: bool = True) -> None:
    """Give back what a try left: collect garbage, then each framework's caches (PyTorch's
    CUDA cache; after an OOM, JAX's compilation caches), for whichever framework the trial
    has imported (none is imported here: `Adapter.free_memory`)."""
    gc.collect()
    for framework in adapters():
        framework.free_memory(after_oom)
