"""The attribution rule of a shared GPU (`trialq.gpu.attribution`), as a table: what
each NVML family lets the start probe, the guard, the start check and the OOM rule conclude.
The figures are made up: no GPU, no NVML."""

from __future__ import annotations

import pytest

from trialq.gpu.allowance import OUTSIDE_ALLOCATOR_MB, allowance_bytes
from trialq.gpu.attribution import (
    Overrun,
    Own,
    ProcessView,
    Reading,
    Source,
    Stranger,
    classify,
    crowded,
    others_memory,
    overrun,
    own_memory,
    shortfall,
    strangers,
)

MIB = 2**20
GIB = 2**30
PROBE = 1234
HELD = 64 * MIB
CONTEXT = 512 * MIB
TREE = frozenset({10, 11})


@pytest.mark.parametrize(
    ("listed", "expected"),
    [
        ({PROBE: HELD + CONTEXT, 77: GIB}, ProcessView.PIDS),  # host's namespace, or translated
        ({PROBE: HELD}, ProcessView.PIDS),
        ({PROBE: 0}, ProcessView.PIDS_WITHOUT_MEMORY),  # reports 0 for every process
        ({PROBE: None}, ProcessView.PIDS_WITHOUT_MEMORY),  # NVML_VALUE_NOT_AVAILABLE
        ({PROBE: HELD // 2}, ProcessView.PIDS_WITHOUT_MEMORY),  # not what it holds
        ({4_200_001: HELD + CONTEXT}, ProcessView.OTHER_PIDS),  # the host's pids
        ({}, ProcessView.OTHER_PIDS),  # names nothing at all
        (None, ProcessView.NO_PROCESSES),  # the query failed
    ],
)
def test_the_probe_tells_each_family_apart(
    listed: dict[int, int | None] | None, expected: ProcessView
) -> None:
    assert classify(listed, PROBE, HELD) is expected


@pytest.mark.parametrize(
    ("view", "reading", "expected"),
    [
        # NVML names the tree with memory: its figures, the framework's ignored.
        (ProcessView.PIDS, Reading({10: GIB, 11: GIB, 99: 5 * GIB}, 9 * GIB, 7), Own(2 * GIB, Source.NVML_PIDS)),
        # Not on the GPU yet: nothing, by pid.
        (ProcessView.PIDS, Reading({99: GIB}, GIB, None), Own(0, Source.NVML_PIDS)),
        # A figure missing for one of its processes: the framework's instead.
        (ProcessView.PIDS, Reading({10: None}, GIB, GIB), Own(GIB + CONTEXT, Source.FRAMEWORK)),
        # The query failed this time: the framework's.
        (ProcessView.PIDS, Reading(None, GIB, GIB), Own(GIB + CONTEXT, Source.FRAMEWORK)),
        # Named without memory, host pids, no list: the framework's figure plus a context.
        (ProcessView.PIDS_WITHOUT_MEMORY, Reading({10: 0}, 3 * GIB, GIB), Own(GIB + CONTEXT, Source.FRAMEWORK)),
        (ProcessView.OTHER_PIDS, Reading({10: 5 * GIB}, 6 * GIB, GIB), Own(GIB + CONTEXT, Source.FRAMEWORK)),
        (ProcessView.NO_PROCESSES, Reading(None, 6 * GIB, 2 * GIB), Own(2 * GIB + CONTEXT, Source.FRAMEWORK)),
        # ... and without one: unguarded.
        (ProcessView.OTHER_PIDS, Reading({10: 5 * GIB}, 6 * GIB, None), Own(None, Source.NONE)),
        # Not probed: by pid where NVML names the tree, else the framework's, else nothing.
        (ProcessView.UNKNOWN, Reading({10: GIB}, GIB, 5), Own(GIB, Source.NVML_PIDS)),
        (ProcessView.UNKNOWN, Reading({99: GIB}, GIB, GIB), Own(GIB + CONTEXT, Source.FRAMEWORK)),
        (ProcessView.UNKNOWN, Reading({99: GIB}, GIB, None), Own(None, Source.NONE)),
    ],
)  # fmt: skip
def test_the_trials_own_memory_by_family(
    view: ProcessView, reading: Reading, expected: Own
) -> None:
    assert own_memory(view, reading, TREE, CONTEXT) == expected


@pytest.mark.parametrize(
    ("used", "own", "total", "limit", "is_crowded"),
    [
        (10 * GIB, 2 * GIB, 16 * GIB, 8 * GIB, False),  # the others hold 8 of the other 8
        (11 * GIB, 2 * GIB, 16 * GIB, 8 * GIB, True),  # 9: one inside this trial's share
        # Processes NVML leaves out (another namespace's) still count: the device's figure.
        (15 * GIB, 0, 16 * GIB, 8 * GIB, True),
        (None, 2 * GIB, 16 * GIB, 8 * GIB, False),  # NVML failed: nothing concluded
        (15 * GIB, None, 16 * GIB, 8 * GIB, False),  # no figure of its own: nothing either
        (15 * GIB, 0, 16 * GIB, None, False),  # no budget, no share to crowd
    ],
)
def test_crowding_counts_the_device_less_the_trials_own(
    used: int | None, own: int | None, total: int, limit: int | None, is_crowded: bool
) -> None:
    others = others_memory(Reading({}, used), Own(own, Source.FRAMEWORK))
    assert crowded(others, total, limit) is is_crowded


LOCAL = {50, 51}


@pytest.mark.parametrize(
    ("view", "listed", "expected"),
    [
        # A process of this container, not the worker's, over the tolerance: a stranger.
        (ProcessView.PIDS, {10: GIB, 50: GIB}, [Stranger("0", 50, GIB)]),
        (ProcessView.PIDS, {50: 100 * MIB}, []),  # within the tolerance
        # Not this container's (another pod's, an MPS server, seen with the host's pids).
        (ProcessView.PIDS, {60: GIB}, []),
        # Named without memory: a local stranger holds an unknown amount, refused for.
        (ProcessView.PIDS_WITHOUT_MEMORY, {51: 0}, [Stranger("0", 51, None)]),
        # Where NVML names no process of this worker, nobody is judged by pid.
        (ProcessView.OTHER_PIDS, {50: GIB}, []),
        (ProcessView.NO_PROCESSES, None, []),
        (ProcessView.UNKNOWN, {50: GIB}, []),
    ],
)
def test_the_start_check_refuses_only_for_this_containers_strangers(
    view: ProcessView, listed: dict[int, int | None] | None, expected: list[Stranger]
) -> None:
    found = strangers(view, "0", listed, TREE, 256 * MIB, LOCAL.__contains__)
    assert found == expected


@pytest.mark.parametrize(
    ("used", "limit", "lacking"),
    [
        (8 * GIB, 8 * GIB, 0),  # its share is free
        (8 * GIB + 200 * MIB, 8 * GIB, 0),  # short by less than the tolerance
        (12 * GIB, 8 * GIB, 4 * GIB - 256 * MIB),  # held by whatever it is: waited on, noted
        (None, 8 * GIB, 0),  # NVML failed: nothing to wait on
        (12 * GIB, None, 0),  # no budget
    ],
)
def test_memory_no_one_is_named_for_is_a_shortfall_never_a_refusal(
    used: int | None, limit: int | None, lacking: int
) -> None:
    assert shortfall(Reading(None, used), 16 * GIB, limit, 256 * MIB) == lacking


def test_every_view_says_what_it_means() -> None:
    assert len({view.describe() for view in ProcessView}) == len(ProcessView)
    assert {v for v in ProcessView if v.names_own} == {
        ProcessView.PIDS,
        ProcessView.PIDS_WITHOUT_MEMORY,
    }


BUDGET = 8 * GIB
ALLOW = 2 * GIB


@pytest.mark.parametrize(
    ("own", "reserved", "framework", "expected"),
    [
        # CuPy beside PyTorch: 4 GiB outside the allocator, past budget + allowance: named.
        (Own(11 * GIB, Source.NVML_PIDS), 7 * GIB, "torch", Overrun(11 * GIB, 7 * GIB, ALLOW, BUDGET)),
        # No framework at all (CuPy alone): everything it holds is outside an allocator.
        (Own(11 * GIB, Source.NVML_PIDS), None, None, Overrun(11 * GIB, None, ALLOW, BUDGET)),
        # Its framework's lazily loaded kernels within the allowance: a healthy trial.
        (Own(9 * GIB, Source.NVML_PIDS), 7 * GIB, "torch", None),
        # Much outside the allocator, but the trial within its budget plus allowance: no kill.
        (Own(9 * GIB, Source.NVML_PIDS), 2 * GIB, "torch", None),
        # The allocator itself past the budget (a cap that failed): not growth outside it.
        (Own(11 * GIB, Source.NVML_PIDS), 10 * GIB, "torch", None),
        # The framework's reserved bytes cannot be read (TensorFlow): nothing can be named.
        (Own(20 * GIB, Source.NVML_PIDS), None, "tensorflow", None),
        # Only the framework's estimate (`other-pids`): never a kill, whatever it says.
        (Own(20 * GIB, Source.FRAMEWORK), 7 * GIB, "torch", None),
        (Own(None, Source.NONE), None, None, None),
    ],
)  # fmt: skip
def test_the_guard_kills_only_for_growth_outside_the_allocator_that_nvml_names(
    own: Own, reserved: int | None, framework: str | None, expected: Overrun | None
) -> None:
    reading = Reading({10: own.bytes}, 12 * GIB, reserved)
    assert overrun(own, reading, BUDGET, ALLOW, framework) == expected


def test_no_budget_no_kill() -> None:
    own = Own(40 * GIB, Source.NVML_PIDS)
    assert overrun(own, Reading({}, 40 * GIB, 0), None, ALLOW, None) is None


def test_each_framework_is_allowed_its_own_outside_the_allocator() -> None:
    assert allowance_bytes("torch", CONTEXT) == CONTEXT + OUTSIDE_ALLOCATOR_MB["torch"] * MIB
    assert allowance_bytes("jax", CONTEXT) < allowance_bytes("torch", CONTEXT)
    assert allowance_bytes(None, CONTEXT) < allowance_bytes("jax", CONTEXT)


@pytest.mark.parametrize(
    ("reserved_now", "is_crowded"),
    [
        # It holds 1 GiB now (its peak was 7): the others hold 12 - 1.5, inside its share.
        (GIB, True),
        # Read from its peak instead, the others would seem to hold 4.5: "its own" OOM.
        (7 * GIB, False),
    ],
)
def test_a_crowded_out_trial_is_judged_on_what_it_holds_now(
    reserved_now: int, is_crowded: bool
) -> None:
    reading = Reading(None, 12 * GIB, reserved_now)
    own = own_memory(ProcessView.OTHER_PIDS, reading, TREE, CONTEXT)
    assert crowded(others_memory(reading, own), 16 * GIB, 8 * GIB) is is_crowded
