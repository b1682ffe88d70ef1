"""`trial.fit_batch_size`: the search as a table, and the doing against the real
out-of-memory exception types of PyTorch and JAX (constructed on CPU, raised by a fake try
past a threshold: no memory is allocated)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from trialq.trial import batch_size
from trialq.trial.batch_size import NoBatchSizeFits, search
from trialq.trial.context import TrialContext
from trialq.wire.channel import TrialAddress
from trialq.wire.failures import classify
from trialq.wire.messages import Outcome


@pytest.mark.parametrize(
    ("start", "maximum", "largest_fitting", "found", "tried"),
    [
        (32, 4096, 100, 100, [32, 64, 128, 96, 112, 104, 100, 102, 101]),
        (32, 4096, 64, 64, [32, 64, 128, 96, 80, 72, 68, 66, 65]),
        (32, 4096, 10_000, 4096, [32, 64, 128, 256, 512, 1024, 2048, 4096]),
        (32, 100, 10_000, 100, [32, 64, 100]),
        (32, 100, 99, 99, [32, 64, 100, 82, 91, 95, 97, 98, 99]),
        (32, 4096, 5, 5, [32, 16, 8, 4, 6, 5]),
        (1, 8, 1, 1, [1, 2]),
        (4, 4096, 0, None, [4, 2, 1]),
        (5000, 4096, 4096, 4096, [4096]),
    ],
)
def test_the_search_doubles_then_bisects(
    start: int, maximum: int, largest_fitting: int, found: int | None, tried: list[int]
) -> None:
    result = search(lambda size: size <= largest_fitting, start, maximum, max_tries=25)
    assert result.size == found
    assert [size for size, _ in result.tries] == tried
    assert all(ok == (size <= largest_fitting) for size, ok in result.tries)


def test_the_search_stops_at_max_tries_with_the_largest_fit_so_far() -> None:
    result = search(lambda size: size <= 1000, 1, 1 << 20, max_tries=4)
    assert [size for size, _ in result.tries] == [1, 2, 4, 8] and result.size == 8


def test_a_start_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="start at 1"):
        search(lambda size: True, 0, 10, max_tries=5)


def _torch_oom(size: int) -> BaseException:
    torch = pytest.importorskip("torch")
    return torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size} MiB")


def _jax_oom(size: int) -> BaseException:
    errors = pytest.importorskip("jax.errors")
    return errors.JaxRuntimeError(
        f"RESOURCE_EXHAUSTED: Failed to allocate request for {size}B on device ordinal 0"
    )


def _wrapped_oom(size: int) -> BaseException:
    """Lightning and DataLoaders re-raise: the OOM is the cause of what the try sees."""
    try:
        raise _torch_oom(size)
    except RuntimeError as exc:
        wrapped = RuntimeError("the training step failed")
        wrapped.__cause__ = exc
        return wrapped


def _try_up_to(threshold: int, oom: Callable[[int], BaseException]) -> Callable[[int], None]:
    """A fake try: a size past `threshold` raises the framework's real OOM exception."""

    def try_batch(size: int) -> None:
        if size > threshold:
            raise oom(size)

    return try_batch


@pytest.fixture(autouse=True)
def _frees_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """No try here allocates: what `free_memory` does is the framework's (and JAX's cleared
    caches recompile whatever an earlier test compiled in this process)."""
    monkeypatch.setattr(batch_size, "free_memory", lambda after_oom: None)


def _context() -> TrialContext:
    return TrialContext(TrialAddress("s", 0, 1), {}, None)


@pytest.mark.slow
@pytest.mark.parametrize("oom", [_torch_oom, _jax_oom, _wrapped_oom])
@pytest.mark.parametrize(
    ("threshold", "start", "maximum", "margin", "expected"),
    [(300, 32, 4096, 0.0, 300), (300, 32, 4096, 0.1, 270), (300, 32, 128, 0.0, 128)],
)
def test_fit_batch_size_records_what_fits(
    oom: Callable[[int], BaseException],
    threshold: int,
    start: int,
    maximum: int,
    margin: float,
    expected: int,
) -> None:
    trial = _context()
    size = trial.fit_batch_size(_try_up_to(threshold, oom), start=start, max=maximum, margin=margin)
    assert size == expected and trial.fitted_batch_size == expected


def test_when_not_even_one_fits_the_trial_ends_oom() -> None:
    trial = _context()
    with pytest.raises(
        NoBatchSizeFits, match="not even a batch of 1 fits: OutOfMemoryError"
    ) as info:
        trial.fit_batch_size(_try_up_to(0, _torch_oom), start=8)
    assert classify(info.value) is Outcome.OOM and trial.fitted_batch_size is None


def test_an_error_that_is_not_an_oom_ends_the_search_as_itself() -> None:
    def try_batch(size: int) -> None:
        raise ValueError("shapes do not match")

    with pytest.raises(ValueError, match="shapes do not match"):
        _context().fit_batch_size(try_batch)


def test_memory_is_freed_after_every_try(monkeypatch: pytest.MonkeyPatch) -> None:
    freed: list[int] = []
    tried: list[int] = []
    freeing = lambda after_oom: freed.append((len(tried), after_oom))  # noqa: E731
    monkeypatch.setattr(batch_size, "free_memory", freeing)
    fake = _try_up_to(20, _torch_oom)
    _context().fit_batch_size(lambda size: (tried.append(size), fake(size)), start=16, max=64)
    assert tried == [16, 32, 24, 20, 22, 21]
    assert freed == [(1, False), (2, True), (3, True), (4, False), (5, True), (6, True)]
