"""A worker starting on a busy card waits for room, bounded, in one line; a budget that fits
no card is refused at once. The measures are made up (a fake's), the clock a counter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trialq.errors import UsageError
from trialq.gpu.busy_card import shares_with_room
from trialq.gpu.context_probe import ContextMeasure
from trialq.gpu.inventory import Gpu
from trialq.gpu.plan import GpuPlan
from trialq.gpu.share import GpuShare

MIB = 2**20
GIB = 2**30
CARD = Gpu("GPU-fake-0", "FakeGPU (a fake)", 16 * GIB)
PLAN = GpuPlan(trials_per_gpu=2, gpu_memory_mb=6000)
"""Two trials of 6000 MiB beside their contexts: they fit a 16 GiB card, not 9 GiB free."""


def _measure(usable_gib: float) -> dict[str, ContextMeasure]:
    return {CARD.id: ContextMeasure(CARD.id, 500 * MIB, int(usable_gib * GIB), 16 * GIB)}


class Clock:
    """A clock that moves only when slept on: the wait's bound without waiting it."""

    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def __call__(self) -> float:
        return self.now


def _run(
    readings: Iterator[dict[str, ContextMeasure]], wait_s: float
) -> tuple[tuple[GpuShare, ...], list[str]]:
    said: list[str] = []
    clock = Clock()
    shares = shares_with_room(
        PLAN, (CARD,), lambda: next(readings), wait_s, said.append, clock.sleep, clock
    )
    return shares, said


def test_a_card_with_room_starts_at_once_and_says_nothing() -> None:
    shares, said = _run(iter([_measure(15)]), wait_s=60)
    assert said == [] and len(shares) == 2


def test_a_busy_card_is_waited_on_in_one_line_until_it_has_room() -> None:
    shares, said = _run(iter([_measure(9), _measure(9), _measure(15)]), wait_s=60)

    assert len(shares) == 2
    assert len(said) == 1 and said[0].startswith("GPUs busy: ") and "waiting up to 60 s" in said[0]


def test_past_the_bound_it_starts_with_the_cards_room_never_a_crash_loop() -> None:
    shares, said = _run(iter([_measure(9)] * 100), wait_s=12)

    assert [share.budget_bytes for share in shares] == [6000 * MIB] * 2
    assert len(said) == 2 and "still busy after 12 s" in said[1]


def test_a_budget_that_fits_no_card_is_refused_at_once() -> None:
    too_big = GpuPlan(trials_per_gpu=2, gpu_memory_mb=9000)
    with pytest.raises(UsageError, match="cannot hold 2 trials of 9000 MiB"):
        shares_with_room(too_big, (CARD,), lambda: _measure(15), 60, print)
