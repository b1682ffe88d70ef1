"""A worker that starts on a busy card waits for room, bounded, instead of failing.

Where the worker measured its GPUs (`trialq.gpu.context_probe`), its budgets must fit in what
CUDA lets its processes have now, and neighbours (another pod, a notebook) may hold part of
it at that moment. A `--gpu-memory-mb` that cannot fit even on an empty card is the user's
mistake: refused at once (exit 2). One that fits the card but not beside what others hold
now is a busy card: the worker says so in one line, measures again every few seconds for up
to `wait_s`, and then starts with the card's room, so its trials meet the neighbours' memory
at their own start check (waited on, noted: docs/oom.md), never a crash loop at the
worker's start.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

from trialq.errors import UsageError
from trialq.gpu.context_probe import ContextMeasure
from trialq.gpu.inventory import Gpu
from trialq.gpu.plan import GpuPlan
from trialq.gpu.share import GpuShare

RECHECK_S = 5.0
"""How often a busy card is measured again."""

Measure = Callable[[], Mapping[str, ContextMeasure]]


def shares_with_room(
    plan: GpuPlan,
    gpus: tuple[Gpu, ...],
    measure: Measure,
    wait_s: float,
    say: Callable[[str], None],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[GpuShare, ...]:
    """The slots' shares once the budgets fit beside what others hold (waiting up to
    `wait_s`), else planned on the card's room; a plan that fits no card raises at once."""
    measures = measure()
    try:
        return plan.shares(gpus, measures)
    except UsageError as busy:
        empty = _empty_cards(measures)
        plan.shares(gpus, empty)  # raises where it cannot fit even on an empty card
        say(f"GPUs busy: {busy}; waiting up to {wait_s:.0f} s for the others to make room")
    deadline = clock() + wait_s
    while (left := deadline - clock()) > 0:
        sleep(min(RECHECK_S, left))
        measures = measure()
        try:
            return plan.shares(gpus, measures)
        except UsageError:
            continue
    say(
        f"GPUs still busy after {wait_s:.0f} s: starting with the card's room; each trial "
        "waits at its start while others hold part of its share (docs/oom.md)"
    )
    return plan.shares(gpus, _empty_cards(measures))


def _empty_cards(measures: Mapping[str, ContextMeasure]) -> dict[str, ContextMeasure]:
    """The measures as of an empty card: all of CUDA's total usable."""
    return {
        gpu: dataclasses.replace(found, usable_bytes=found.total_bytes)
        for gpu, found in measures.items()
    }
