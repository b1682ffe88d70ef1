"""GPU accounting without the host's PIDs: real worker processes in real PID namespaces
(`unshare --pid --fork --mount-proc`, as containers without `hostPID`), real Redis, and a
FAKE NVML (`tests/fake_nvml.py`) answering as each driver family does. Every memory figure
here is a fake's, never a GPU's. docs/oom.md, "What NVML can be trusted for", says what each
family leaves the guard, the start check and the OOM rule."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import fake_nvml
import pytest
import redis
from trial_requests import trial_request
from waiting import wait_until

from trialq._celery.dispatcher import CeleryDispatcher
from trialq.gpu.attribution import ProcessView
from trialq.settings import Settings
from trialq.wire import heartbeat
from trialq.wire.dispatch import TaskPhase
from trialq.wire.messages import Outcome, TrialResult

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("unshare") is None,
        reason="PID namespaces need root and unshare(1)",
    ),
]

TESTS_DIR = Path(__file__).resolve().parent.parent
GIB = 2**30
MIB = 2**20
FAKE_TOTAL = 16 * GIB
"""The fake GPU's memory: a fake's figure."""
WAIT_S = 60.0


@dataclass(frozen=True)
class Family:
    """A driver family as the fake NVML plays it, and what the worker should conclude."""

    pids: str
    memory: str
    processes: str
    view: str
    """The worker's start probe's verdict (`ProcessView`'s value)."""
    accounting: str
    """Where the guard's figure of a trial's own memory comes from."""
    guard_kills: bool
    """Whether the guard can name growth outside the allocator (NVML names the trial's
    processes with their memory), so kills a trial that bypasses its framework."""


FAMILIES = {
    "host-pids": Family("host", "reported", "ok", "other-pids", "framework", False),
    "translated": Family("translated", "reported", "ok", "pids", "nvml-pids", True),
    "callers-pids": Family("callers", "reported", "ok", "pids", "nvml-pids", True),
    "memory-zero": Family("translated", "zero", "ok", "pids-without-memory", "framework", False),
    "memory-unavailable": Family("translated", "unavailable", "ok", "pids-without-memory", "framework", False),
    "no-process-list": Family("shared", "reported", "error", "no-process-list", "framework", False),
}  # fmt: skip


@pytest.fixture
def fake_gpu(tmp_path: Path) -> Path:
    """One fake GPU of 16 GiB, in a folder of its own."""
    folder = tmp_path / "fake-nvml"
    fake_nvml.describe(folder, 1, FAKE_TOTAL)
    return folder


@pytest.fixture
def pod(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., Path]]:
    """Start `trialq worker --gpus 0 ...` in a PID namespace of its own (a pod without
    hostPID); its log. Killed afterwards, namespace and all."""
    started: list[subprocess.Popen[bytes]] = []

    def start(
        nvml_dir: Path,
        queue: str,
        *flags: str,
        own_namespace: bool = True,
        extra_env: dict[str, str] | None = None,
    ) -> Path:
        name = f"pod-{len(started)}@test"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
            "TRIALQ_BROKER_URL": redis_url, "TRIALQ_RESULT_BACKEND": redis_url,
            "TRIALQ_ALLOWED_MODULES": "fake_gpu_trials", "TRIALQ_PRELOAD": "none",
            "TRIALQ_NVML_MODULE": "fake_nvml", "FAKE_NVML_DIR": str(nvml_dir),
            "TRIALQ_HEARTBEAT_INTERVAL_S": "0.5", "TRIALQ_GPU_UNATTRIBUTED_WAIT_S": "1",
            **(extra_env or {}),
        }  # fmt: skip
        unshare = ["unshare", "--pid", "--fork", "--mount-proc"] if own_namespace else []
        command = [*unshare, sys.executable, "-m", "trialq",
                   "worker", "--queue", queue, "--hostname", name, "--loglevel", "INFO",
                   "--gpus", "0", *flags]  # fmt: skip
        log = tmp_path / f"pod{len(started)}.log"
        worker = subprocess.Popen(command, env=env, stdout=log.open("wb"),
                                  stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        started.append(worker)
        client = redis.Redis.from_url(redis_url)
        wait_until(
            lambda: worker.poll() is not None or heartbeat.is_alive(client, name),
            60, "the pod's heartbeat",
        )  # fmt: skip
        assert worker.poll() is None, log.read_text()
        return log

    yield start
    for worker in started:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


@pytest.fixture
def tenant(fake_gpu: Path) -> Iterator[Callable[[int], None]]:
    """Another tenant of the GPU, outside every pod (another namespace's process, as an MPS
    server or another pod's trial is): holds `n_bytes` until the test ends."""
    held: list[subprocess.Popen[bytes]] = []

    def hold(n_bytes: int) -> None:
        code = f"import fake_nvml, sys, time; fake_nvml.hold({n_bytes}); print(flush=True); time.sleep(120)"
        env = {**os.environ, "PYTHONPATH": str(TESTS_DIR), "FAKE_NVML_DIR": str(fake_gpu),
               "CUDA_VISIBLE_DEVICES": "0"}  # fmt: skip
        process = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
        held.append(process)
        assert process.stdout is not None and process.stdout.readline() == b"\n"

    yield hold
    for process in held:
        process.kill()
        process.wait()


def _run(redis_url: str, queue: str, requests: list[dict[str, object]]) -> list[TrialResult]:
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url))
    ids = [
        dispatcher.submit(trial_request(study="accounting", number=n, **fields), queue)
        for n, fields in enumerate(requests)
    ]
    final = (TaskPhase.FINISHED, TaskPhase.FAILED)
    statuses = wait_until(
        lambda: (s := dispatcher.statuses(ids)) and all(x.phase in final for x in s.values()) and s,
        WAIT_S, lambda: f"trials to end: {dispatcher.statuses(ids)}",
    )  # fmt: skip
    results = [statuses[task_id].result for task_id in ids]
    assert all(result is not None for result in results), statuses
    return [result for result in results if result is not None]


def _ready_line(log: Path) -> str:
    return next(line for line in log.read_text().splitlines() if " ready: " in line)


@pytest.fixture(params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest, fake_gpu: Path) -> Family:
    chosen = FAMILIES[request.param]
    fake_nvml.behave_as(fake_gpu, chosen.pids, chosen.memory, chosen.processes)
    return chosen


def test_packing_runs_and_the_guard_kills_only_growth_it_can_name(
    redis_url: str, tmp_path: Path, fake_gpu: Path, family: Family, pod: Callable[..., Path]
) -> None:
    log = pod(fake_gpu, "gpu", "--trials-per-gpu", "3")
    records = tmp_path / "records"
    records.mkdir()
    packed = {"entrypoint": "fake_gpu_trials:records_its_gpu",
              "params": {"log": str(records), "hold_mb": 1000, "sleep_s": 2.0}}  # fmt: skip
    over = {"entrypoint": "fake_gpu_trials:overruns_its_budget", "params": {"sleep_s": 2.0}}

    results = _run(redis_url, "gpu", [packed, packed, over, packed])

    assert f"GPU processes: {ProcessView(family.view).said()}" in _ready_line(log)
    (beat,) = heartbeat.live_workers(redis.Redis.from_url(redis_url))
    assert beat.gpus is not None and beat.gpus.processes == family.view  # `trialq status`'s
    first, second, overrun, fourth = results
    assert [r.outcome for r in (first, second, fourth)] == [Outcome.OK] * 3, results
    if family.guard_kills:  # NVML's figure, past budget and allowance outside the allocator
        assert overrun.outcome is Outcome.GPU_GUARD, overrun
        assert overrun.gpu_guard is not None and "GPU memory guard" in (overrun.error or "")
    else:  # only the framework's figure, which its cap bounds: never a kill on an estimate
        assert overrun.outcome is Outcome.OK and overrun.gpu_guard is None, overrun
    assert not overrun.oom_caused_by_neighbour
    assert {r.gpu_accounting for r in results} == {family.accounting}
    assert "stops taking trials" not in log.read_text()


def test_where_the_guard_cannot_see_the_interposer_refuses_the_allocation_as_an_oom(
    redis_url: str, tmp_path: Path, fake_gpu: Path, pod: Callable[..., Path]
) -> None:
    """`other-pids` (a pod without the host's PIDs): the guard never kills there; with the
    allocation interposer preloaded (a STAND-IN library; the FAKE interposer refusing as
    HAMi-core does), the bypass is refused at its budget and the trial ends with its own
    framework's OOM, told honestly; its neighbour completes."""
    fake_nvml.behave_as(fake_gpu, pids="host")
    stand_in = next(
        line.split()[-1]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if "/libm.so" in line or "/libm-" in line
    )
    env = {"LD_PRELOAD": stand_in, "TRIALQ_GPU_INTERPOSER": stand_in}
    pod(fake_gpu, "gpu", "--trials-per-gpu", "2", extra_env=env)
    records = tmp_path / "records"
    records.mkdir()
    packed = {"entrypoint": "fake_gpu_trials:records_its_gpu",
              "params": {"log": str(records), "hold_mb": 1000, "sleep_s": 2.0}}  # fmt: skip
    over = {"entrypoint": "fake_gpu_trials:overruns_its_budget", "params": {"sleep_s": 2.0}}

    overrun, neighbour = _run(redis_url, "gpu", [over, packed])

    assert overrun.outcome is Outcome.OOM and overrun.gpu_guard is None, overrun
    assert "CUDA_ERROR_OUT_OF_MEMORY" in (overrun.error or "")
    assert not overrun.oom_caused_by_neighbour
    assert neighbour.outcome is Outcome.OK, neighbour


def test_own_and_neighbour_ooms_are_told_apart(
    redis_url: str,
    fake_gpu: Path,
    family: Family,
    pod: Callable[..., Path],
    tenant: Callable[[int], None],
) -> None:
    pod(fake_gpu, "gpu", "--trials-per-gpu", "2")  # shares of 7.5 GiB, 8 with a context
    oom = {"entrypoint": "fake_gpu_trials:runs_out_of_memory",
           "params": {"hold_mb": 1000, "sleep_s": 0.5}}  # fmt: skip

    (own,) = _run(redis_url, "gpu", [oom])
    tenant(12 * GIB)  # 4 GiB of the trial's 8 GiB share taken by no process of the pod's
    (crowded,) = _run(redis_url, "gpu", [oom])

    assert own.outcome is Outcome.OOM and not own.oom_caused_by_neighbour, own
    assert crowded.outcome is Outcome.OOM and crowded.oom_caused_by_neighbour, crowded
    # It waited for the memory nobody could be named for, then ran, and says so.
    assert "cannot attribute" in (crowded.gpu_accounting_note or ""), crowded


@pytest.mark.parametrize("pids", ["host", "callers", "translated"])
def test_two_pods_share_one_gpu_and_neither_takes_the_other_for_a_stranger(
    redis_url: str, tmp_path: Path, fake_gpu: Path, pod: Callable[..., Path], pids: str
) -> None:
    fake_nvml.behave_as(fake_gpu, pids=pids)
    logs = [pod(fake_gpu, queue, "--gpu-memory-mb", "6000") for queue in ("pod-a", "pod-b")]
    records = tmp_path / "records"
    records.mkdir()
    held = {"entrypoint": "fake_gpu_trials:records_its_gpu",
            "params": {"log": str(records), "hold_mb": 5000, "sleep_s": 2.0}}  # fmt: skip
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url))
    first = dispatcher.submit(trial_request(study="pods", number=0, **held), "pod-a")
    time.sleep(0.5)  # pod a's trial holds its 5000 MiB when pod b's starts

    (second,) = _run(redis_url, "pod-b", [held])
    done = wait_until(lambda: dispatcher.statuses([first])[first].result, WAIT_S, "pod a's trial")

    assert done.outcome is Outcome.OK and second.outcome is Outcome.OK, (done, second)
    assert not second.device_refused and second.gpu_accounting_note is None, second
    for log in logs:
        assert "stops taking trials" not in log.read_text()


def test_a_second_worker_from_the_same_shell_is_no_stranger_and_no_worker_stops(
    redis_url: str, tmp_path: Path, fake_gpu: Path, pod: Callable[..., Path]
) -> None:
    """Two workers in one PID namespace and one cgroup (started from one shell): NVML names
    each one's trials to the other, and nothing marks them as the other's."""
    fake_nvml.behave_as(fake_gpu, pids="shared")
    logs = [
        pod(fake_gpu, queue, "--gpu-memory-mb", "6000", own_namespace=False)
        for queue in ("shell-a", "shell-b")
    ]
    records = tmp_path / "records"
    records.mkdir()
    held = {"entrypoint": "fake_gpu_trials:records_its_gpu",
            "params": {"log": str(records), "hold_mb": 5000, "sleep_s": 2.0}}  # fmt: skip
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url))
    first = dispatcher.submit(trial_request(study="shell", number=0, **held), "shell-a")
    wait_until(
        lambda: any(
            path.read_text().startswith(str(5000 * MIB))
            for path in (fake_gpu / "used").glob("*/*")
        ),
        WAIT_S, "worker a's trial to hold its memory",
    )  # fmt: skip

    (second,) = _run(redis_url, "shell-b", [held])
    done = wait_until(lambda: dispatcher.statuses([first])[first].result, WAIT_S, "a's trial")

    assert done.outcome is Outcome.OK and second.outcome is Outcome.OK, (done, second)
    assert not second.device_refused, second
    for log in logs:
        assert "stops taking trials" not in log.read_text()


def test_nvml_failing_mid_run_leaves_trials_unrefused_with_a_note_and_one_warning(
    redis_url: str, tmp_path: Path, fake_gpu: Path, pod: Callable[..., Path]
) -> None:
    fake_nvml.behave_as(fake_gpu, pids="translated")
    log = pod(fake_gpu, "gpu", "--trials-per-gpu", "2")
    fake_nvml.behave_as(fake_gpu, pids="translated", processes="error")  # after the probe
    records = tmp_path / "records"
    records.mkdir()
    trial = {"entrypoint": "fake_gpu_trials:records_its_gpu",
             "params": {"log": str(records), "hold_mb": 500, "sleep_s": 0.3}}  # fmt: skip

    results = _run(redis_url, "gpu", [trial] * 3)

    assert [r.outcome for r in results] == [Outcome.OK] * 3, results
    assert all("NVML failed" in (r.gpu_accounting_note or "") for r in results), results
    assert {r.gpu_accounting for r in results} == {"framework"}  # the framework's figure
    text = log.read_text()
    assert text.count("NVML failed in a trial's GPU memory guard") == 1, text
    assert text.count("GPU start check: NVML failed") == 1, text
    assert "Traceback" not in text
