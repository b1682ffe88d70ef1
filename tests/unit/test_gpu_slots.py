"""GPU slots, their routing, the per-GPU start check and the GPU memory guard, on FAKE GPUs
(`tests/fake_nvml.py`, loaded in this process): a fake's figures, never a GPU's."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import fake_nvml
import pytest
from waiting import wait_until

from trialq.errors import UsageError
from trialq.gpu.allowance import NO_FRAMEWORK_MB
from trialq.gpu.attribution import Overrun, ProcessView
from trialq.gpu.inventory import Gpu, Nvml
from trialq.gpu.once_per_worker import OncePerWorker
from trialq.gpu.plan import CONTEXT_RESERVE_MB, GpuPlan
from trialq.gpu.share import GpuShare
from trialq.gpu.telemetry import WORKER_MARK, NeighbourCheck, TrialMarks
from trialq.trial.gpu_guard import GpuGuard, GpuOverrun
from trialq.wire.heartbeat import GpuBeat, WorkerBeat
from trialq.wire.routing import slot_queues, trial_queue

GIB, MIB = 2**30, 2**20
CARD = Gpu("0", fake_nvml.FAKE_NAME, 16 * GIB)


@pytest.fixture
def nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Nvml]:
    """Two fake GPUs of 16 GiB, GPU 0 visible to this process."""
    fake_nvml.describe(tmp_path, 2, 16 * GIB)
    monkeypatch.setenv("FAKE_NVML_DIR", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    opened = Nvml.open("fake_nvml")
    assert opened is not None
    with opened:
        yield opened


def test_a_trial_goes_to_its_class_queue_and_a_slot_consumes_only_classes_it_holds() -> None:
    assert trial_queue("gpu") == "gpu"
    assert trial_queue("gpu", 1, 12000) == "gpu@1x16g"
    assert trial_queue("gpu", 2) == "gpu@2x"
    assert slot_queues("gpu", 1, 15 * GIB) == (
        "gpu",
        "gpu@1x1g",
        "gpu@1x2g",
        "gpu@1x4g",
        "gpu@1x8g",
    )
    assert slot_queues("gpu", 2, 3 * GIB) == ("gpu@2x", "gpu@2x1g", "gpu@2x2g")
    assert trial_queue("gpu", 1, 12000) not in slot_queues("gpu", 1, 15 * GIB)


def test_slots_share_the_card_after_one_cuda_context_each() -> None:
    shares = GpuPlan(trials_per_gpu=2).shares((CARD, Gpu("1", CARD.model, CARD.total_bytes)))

    assert [share.devices for share in shares] == [("0",), ("0",), ("1",), ("1",)]
    assert {share.budget_bytes for share in shares} == {
        (16 * GIB - 2 * CONTEXT_RESERVE_MB * MIB) // 2
    }


def test_a_slot_spans_its_gpus_and_a_budget_that_cannot_fit_is_refused() -> None:
    two = GpuPlan(gpus_per_trial=2, gpu_memory_mb=4000).shares((CARD, Gpu("1", "x", 8 * GIB)))

    assert two == (GpuShare(("0", "1"), 4000 * MIB, CARD.model, 8 * GIB),)
    with pytest.raises(UsageError, match="cannot hold 4 trials of 5000 MiB"):
        GpuPlan(trials_per_gpu=4, gpu_memory_mb=5000).shares((CARD,))
    with pytest.raises(UsageError, match="do not split"):
        GpuPlan(gpus_per_trial=2).shares((CARD,))


def test_the_start_check_refuses_a_stranger_on_the_gpu_but_not_a_neighbour(nvml: Nvml) -> None:
    share = GpuShare(("0",), 7 * GIB, CARD.model, 16 * GIB)
    left = {**os.environ, WORKER_MARK: "w-1"}  # started by a trial of worker w-1
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=left)
    try:
        fake_nvml.hold(2 * GIB, pid=holder.pid)  # a process a finished trial left behind
        check = NeighbourCheck(
            tolerance_bytes=256 * MIB, settle_s=0.2, view=ProcessView.PIDS,
            marks=TrialMarks("w-1"),
        )  # fmt: skip

        refused = check.refusal(nvml, share, lambda: {os.getpid()})
        as_neighbour = check.refusal(nvml, share, lambda: {os.getpid(), holder.pid})
    finally:
        holder.kill()
        holder.wait()

    assert refused is not None and f"pid {holder.pid} holds 2048 MiB on GPU 0" in refused
    assert as_neighbour is None
    assert check.refusal(nvml, share, lambda: {os.getpid()}) is None  # gone: clean again


def test_the_guard_names_growth_outside_the_allocator_and_tells_a_neighbours_oom_apart(
    nvml: Nvml,
) -> None:
    share = GpuShare(("0",), 7 * GIB, CARD.model, 16 * GIB)
    seen: list[GpuOverrun] = []
    guard = GpuGuard(nvml, share, 512 * MIB, seen.append, framework=lambda: None)
    allowance = 512 * MIB + NO_FRAMEWORK_MB * MIB  # a context, and a library's handles
    fake_nvml.hold(GIB)
    assert not guard.neighbour_caused()  # nothing crowds it
    neighbour = _outside_this_tree()
    try:
        fake_nvml.hold(14 * GIB, pid=neighbour)
        assert guard.neighbour_caused()
        fake_nvml.hold(8 * GIB)  # its allocator past its budget (a cap that failed): not named
        assert guard._sample() is None
        assert not guard.neighbour_caused()  # it holds more than its share now: its own OOM
        fake_nvml.hold(GIB, outside=8 * GIB)  # CuPy beside its framework: named
        assert guard._sample() == GpuOverrun("0", Overrun(9 * GIB, GIB, allowance, 7 * GIB))
    finally:
        os.kill(neighbour, signal.SIGKILL)
    assert guard.peaks() == {"0": 9 * GIB} and not seen


def test_a_guard_never_kills_on_a_frameworks_figure(nvml: Nvml) -> None:
    """Where NVML names none of the trial's processes, its own figure is its framework's
    reserved bytes plus a context: bounded by the cap, so nothing past it can be named."""
    share = GpuShare(("0",), 7 * GIB, CARD.model, 16 * GIB)
    guard = GpuGuard(nvml, share, 512 * MIB, lambda _: None, ProcessView.OTHER_PIDS)
    fake_nvml.hold(GIB, outside=12 * GIB)

    assert guard._sample() is None and guard.peaks() == {"0": GIB + 512 * MIB}
    assert guard.accounting() == "framework"


def _outside_this_tree() -> int:
    """A process that is not this one's descendant (its parent exited): a neighbour's."""
    run = subprocess.run(
        ["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True
    )
    return int(run.stdout)


def test_a_guard_kills_its_process_past_its_share(tmp_path: Path) -> None:
    code = f"""
import os, sys, time
sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
import fake_nvml
from trialq.trial.gpu_guard import GpuGuard
from trialq.gpu.inventory import Nvml
from trialq.gpu.share import GpuShare
fake_nvml.describe(__import__("pathlib").Path({str(tmp_path)!r}), 1, 16 * 2**30)
with Nvml.open("fake_nvml") as nvml, GpuGuard(nvml, GpuShare(("0",), 2**30, None, 16 * 2**30),
                                              0, lambda o: print(o.text(), flush=True)):
    fake_nvml.hold(0, outside=2 * 2**30)
    time.sleep(60)
print("not stopped")
"""
    env = {**os.environ, "FAKE_NVML_DIR": str(tmp_path), "CUDA_VISIBLE_DEVICES": "0"}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)

    assert run.returncode == -9 and time.monotonic() - started < 45, run.stderr
    assert (
        "NVML counted 2048 MiB for the trial's processes on GPU 0, 2048 MiB of it outside"
        in run.stdout
    )
    assert "past its budget of 1024 MiB plus 256 MiB allowed outside the allocator" in run.stdout


def test_gpus_beat_under_a_key_of_their_own_so_older_readers_parse_the_heartbeat() -> None:
    gpus = GpuBeat(("0", "1"), "FakeGPU", 16 * GIB, 8, 1, 3 * GIB + GIB // 2)
    beat = WorkerBeat("w@h", "h", 1, ("gpu",), None, 0.0, gpus=gpus)

    assert "gpus" not in beat.heartbeat_json()
    assert WorkerBeat.from_json({**beat.heartbeat_json(), "later": 1}, gpus) == beat
    assert gpus.describe() == "2 x FakeGPU (16.0 GiB), 8 slots of 1 GPU x 3.5 GiB"


def test_a_guard_without_a_figure_of_its_own_says_the_gpu_was_unguarded(nvml: Nvml) -> None:
    share = GpuShare(("0",), 7 * GIB, CARD.model, 16 * GIB)
    guard = GpuGuard(nvml, share, 512 * MIB, lambda _: None, ProcessView.OTHER_PIDS,
                     allocator=lambda _position, _device: None)  # fmt: skip
    fake_nvml.hold(12 * GIB)  # over its share, but nothing says it is the trial's

    assert guard._sample() is None and guard.peaks() == {}
    assert guard.accounting() == "unguarded"
    assert "GPU 0 unguarded: no figure of the trial's own memory" in (guard.accounting_note() or "")
    assert not guard.neighbour_caused()  # without its own figure, an OOM stays its own


def test_a_warning_is_said_once_per_worker_folder(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = logging.getLogger("trialq.test-once")
    for _trial_process in range(3):
        OncePerWorker(log, tmp_path).warn("nvml", "NVML failed")
    OncePerWorker(log, tmp_path).warn("other", "something else")

    assert [r.getMessage() for r in caplog.records] == ["NVML failed", "something else"]


def test_a_trial_that_peaked_high_and_holds_little_now_is_told_crowded_out(nvml: Nvml) -> None:
    """Attribution from what the trial holds now: its peak is for the records."""
    share = GpuShare(("0",), 7 * GIB, CARD.model, 16 * GIB)
    guard = GpuGuard(nvml, share, 512 * MIB, lambda _: None, ProcessView.OTHER_PIDS)
    fake_nvml.hold(7 * GIB + 256 * MIB)  # its allocator just past its share, a while ago
    assert guard._sample() is None
    fake_nvml.hold(GIB)  # freed back to 1 GiB (a smaller batch size)
    neighbour = _outside_this_tree()
    try:
        fake_nvml.hold(14 * GIB, pid=neighbour)
        assert guard.neighbour_caused()
    finally:
        os.kill(neighbour, signal.SIGKILL)
    assert guard.peaks() == {"0": 7 * GIB + 768 * MIB}


@pytest.mark.parametrize("evidence", ["none", "another worker's mark"])
def test_memory_without_this_workers_mark_is_waited_on_and_noted_never_refused(
    nvml: Nvml, evidence: str
) -> None:
    """A second worker started from the same shell, a notebook in the same login: same
    cgroup, same namespace, but no evidence of being this worker's."""
    share = GpuShare(("0",), 7 * GIB, CARD.model, 16 * GIB)
    env = {name: value for name, value in os.environ.items() if name != WORKER_MARK}
    if evidence != "none":
        env[WORKER_MARK] = "w-2"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        fake_nvml.hold(12 * GIB, pid=holder.pid)
        check = NeighbourCheck(
            tolerance_bytes=256 * MIB, settle_s=0.1, view=ProcessView.PIDS,
            unattributed_wait_s=0.2, marks=TrialMarks("w-1"),
        )  # fmt: skip
        found = check.check(nvml, share, lambda: {os.getpid()})
    finally:
        holder.kill()
        holder.wait()

    assert found.refusal is None
    assert found.note is not None and "cannot attribute" in found.note


def test_a_process_holding_a_slot_file_is_marked_by_it(tmp_path: Path) -> None:
    """A process forked from a trial (no exec: no new environment) inherits its slot lock."""
    lock = tmp_path / "slot-0.lock"
    lock.write_text("")
    code = f"import time; f = open({str(lock)!r}); time.sleep(30)"
    holder = subprocess.Popen([sys.executable, "-c", code], env={"PATH": os.environ["PATH"]})
    try:
        marks = TrialMarks(None, tmp_path)
        wait_until(lambda: marks.carried_by(holder.pid), 10, "the holder to open its file")
        assert not TrialMarks(None, tmp_path / "elsewhere").carried_by(holder.pid)
        assert not TrialMarks("w-1").carried_by(holder.pid)
    finally:
        holder.kill()
        holder.wait()


def test_under_mps_the_clients_are_listed_and_the_guard_names_its_own(
    nvml: Nvml, tmp_path: Path
) -> None:
    """NVML lists an MPS server as the GPU's compute process and its clients apart
    (`nvmlDeviceGetMPSComputeRunningProcesses`): the guard reads the trial among the clients."""
    fake_nvml.behave_as(tmp_path, mps=True)
    fake_nvml.hold(GIB, outside=8 * GIB)

    listed = nvml.processes("0")
    assert listed == {fake_nvml.MPS_SERVER_PID: 0, os.getpid(): 9 * GIB}
    guard = GpuGuard(nvml, GpuShare(("0",), 7 * GIB, CARD.model, 16 * GIB), 512 * MIB,
                     lambda _: None, ProcessView.PIDS, framework=lambda: None)  # fmt: skip
    found = guard._sample()
    assert found is not None and found.figures.own == 9 * GIB
