"""A trial slot is a small value of its own, in a module that knows nothing of Celery."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trialq.worker.slots import SlotHolder, TrialSlot, TrialSlots


def test_a_worker_s_slots_are_values_naming_their_lock_files() -> None:
    slots = TrialSlots.create(2)
    try:
        assert slots.slots == (
            TrialSlot(0, slots.directory / "slot0"),
            TrialSlot(1, slots.directory / "slot1"),
        )
        assert all(slot.lock_file.is_file() for slot in slots.slots)
        with pytest.raises(dataclasses.FrozenInstanceError):
            slots.slots[0].index = 1  # type: ignore[misc]
    finally:
        slots.remove()


def test_a_claimed_slot_is_known_until_it_is_released() -> None:
    slots = TrialSlots.create(2)
    try:
        assert slots.held is None
        assert slots.claim(timeout_s=1)
        assert slots.held == TrialSlot(0, slots.directory / "slot0")
        assert (slots.directory / "slot0").read_text().split()[0] == str(os.getpid())
        slots.release()
        assert slots.held is None
    finally:
        slots.remove()


def test_a_slot_nobody_held_or_this_process_held_waits_for_nobody(tmp_path: Path) -> None:
    assert SlotHolder(0, 0.0).is_gone()
    assert SlotHolder(os.getpid(), 0.0).is_gone()
    assert not SlotHolder(os.getppid(), _create_time(os.getppid())).is_gone()
    assert SlotHolder(os.getppid(), 1.0).is_gone(), "a pid reused by another process"


def _create_time(pid: int) -> float:
    import psutil

    return float(psutil.Process(pid).create_time())


def test_the_slot_module_imports_no_celery() -> None:
    probe = (
        "import sys, trialq.worker.slots; "
        "print(sorted(m for m in ('celery', 'kombu', 'billiard') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
