"""Issue 27's GPU side on a REAL GPU (never a fake): framework caps (PyTorch's memory
fraction, JAX's), several trials packed on one GPU each within its budget, the GPU memory
guard ending an over-budget trial while its neighbour completes, a trial of two GPUs, and
routing refusing a study no slot can fit. Each test starts a real `trialq worker --gpus ...`
that reads the GPUs through NVML (`tests/integration/test_gpu_packing.py` is the same on fake
GPUs, named as such).

Skipped where NVML (nvidia-ml-py) sees no GPU, and per framework where PyTorch or JAX here
has no CUDA (checked in a subprocess: this process never starts CUDA, so it holds nothing
on the GPU that a trial's start check would count): CI's CPU machines skip this module.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from trial_requests import trial_request
from waiting import wait_until

from trialq._celery.dispatcher import CeleryDispatcher
from trialq.gpu.inventory import Gpu, Nvml
from trialq.gpu.plan import CONTEXT_RESERVE_MB
from trialq.settings import Settings
from trialq.wire import heartbeat
from trialq.wire.dispatch import TaskPhase, TaskStatus
from trialq.wire.messages import Outcome, TrialResult
from trialq.wire.routing import trial_queue

pytestmark = [pytest.mark.gpu, pytest.mark.integration]

TESTS_DIR = Path(__file__).resolve().parent.parent
MIB = 2**20
BUDGET_MB = 2048
"""The slot budget the cap tests give (`--gpu-memory-mb`): small beside any GPU."""
WAIT_S = 240.0
"""For trials to end: each starts CUDA (and JAX compiles) in a fresh process."""

_CUDA_CHECK = {
    "torch": "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)",
    "jax": "import jax, sys; sys.exit(0 if jax.devices('gpu') else 1)",
}


@pytest.fixture(scope="module")
def host_gpus() -> tuple[Gpu, ...]:
    """The host's GPUs as NVML lists them (no CUDA context), or a skip."""
    nvml = Nvml.open()
    if nvml is None:
        pytest.skip("no GPU visible through NVML (nvidia-ml-py missing, no driver or no GPU)")
    with nvml:
        gpus = nvml.gpus("all")
    if not gpus:
        pytest.skip("NVML lists no GPU")
    return gpus


def _framework_sees_cuda(name: str) -> None:
    """Skip unless `name` here is a CUDA build that sees a GPU (asked in a subprocess)."""
    env = {**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    try:
        run = subprocess.run(
            [sys.executable, "-c", _CUDA_CHECK[name]], env=env, capture_output=True, timeout=120
        )
    except subprocess.TimeoutExpired:
        pytest.skip(f"{name} took over 2 minutes to look for a GPU")
    if run.returncode != 0:
        pytest.skip(f"{name} here sees no CUDA GPU (not installed, or not a CUDA build)")


@pytest.fixture(scope="module")
def torch_cuda(host_gpus: tuple[Gpu, ...]) -> None:
    _framework_sees_cuda("torch")


@pytest.fixture(scope="module")
def jax_cuda(host_gpus: tuple[Gpu, ...]) -> None:
    _framework_sees_cuda("jax")


@pytest.fixture
def gpu_worker(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start one `trialq worker --gpus ...` on the host's real GPUs; its name. Killed after,
    with its trial processes (its process group)."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*flags: str) -> str:
        name = f"real-gpu-{len(started)}@test"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
            "TRIALQ_BROKER_URL": redis_url, "TRIALQ_RESULT_BACKEND": redis_url,
            "TRIALQ_ALLOWED_MODULES": "gpu_trials", "TRIALQ_PRELOAD": "none",
            "TRIALQ_HEARTBEAT_INTERVAL_S": "0.5",
        }  # fmt: skip
        command = [sys.executable, "-m", "trialq", "worker", "--queue", "gpu",
                   "--hostname", name, "--loglevel", "WARNING", *flags]  # fmt: skip
        log_path = tmp_path / f"worker{len(started)}.log"
        worker = subprocess.Popen(command, env=env, stdout=log_path.open("wb"),
                                  stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        started.append(worker)
        client = redis.Redis.from_url(redis_url)
        wait_until(
            lambda: worker.poll() is not None or heartbeat.is_alive(client, name),
            60, "the GPU worker's heartbeat",
        )  # fmt: skip
        assert worker.poll() is None, log_path.read_text()
        return name

    yield start
    for worker in started:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def _run(redis_url: str, queue: str, requests: list[dict[str, object]]) -> list[TrialResult]:
    """Send the trials at once and wait for every one to end; their results, in order."""
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url))
    ids = [
        dispatcher.submit(
            trial_request(study="real-gpu", number=n, **{"timeout_s": 180, **fields}), queue
        )
        for n, fields in enumerate(requests)
    ]
    final = (TaskPhase.FINISHED, TaskPhase.FAILED)

    def ended() -> dict[str, TaskStatus] | None:
        statuses = dispatcher.statuses(ids)
        return statuses if all(s.phase in final for s in statuses.values()) else None

    statuses = wait_until(ended, WAIT_S, lambda: f"trials to end: {dispatcher.statuses(ids)}")
    results = [statuses[task_id].result for task_id in ids]
    assert all(result is not None for result in results), statuses
    return [result for result in results if result is not None]


def _slot_budget(redis_url: str) -> int:
    """The slot budget the worker announces in its heartbeat (its GPUs as it measured them)."""
    (beat,) = heartbeat.live_workers(redis.Redis.from_url(redis_url))
    assert beat.gpus is not None and beat.gpus.slot_budget_bytes is not None, beat
    return beat.gpus.slot_budget_bytes


def _torch(mb: int, **params: object) -> dict[str, object]:
    return {"entrypoint": "gpu_trials:torch_allocates", "framework": "torch",
            "params": {"mb": mb, **params}}  # fmt: skip


def _jax(mb: int, **params: object) -> dict[str, object]:
    return {"entrypoint": "gpu_trials:jax_allocates", "framework": "jax",
            "params": {"mb": mb, **params}}  # fmt: skip


def _within(result: TrialResult, budget_bytes: int) -> None:
    """The framework's peak on each GPU within the budget, and the budget the one given."""
    assert result.gpu_budget_bytes == budget_bytes, result
    assert result.gpu_peaks_bytes, f"no peaks recorded: {result}"
    assert max(result.gpu_peaks_bytes) <= budget_bytes, result.gpu_peaks_bytes


@pytest.mark.usefixtures("torch_cuda")
def test_a_torch_trial_past_its_cap_ends_oom_with_the_cap_and_its_peaks_recorded(
    redis_url: str, gpu_worker: Callable[..., str]
) -> None:
    gpu_worker("--gpus", "0", "--trials-per-gpu", "1", "--gpu-memory-mb", str(BUDGET_MB))

    (result,) = _run(redis_url, "gpu", [_torch(2 * BUDGET_MB)])

    assert result.outcome is Outcome.OOM, result
    assert "GPU memory guard" not in (result.error or ""), "PyTorch's own cap, not the guard"
    assert result.framework == "torch" and result.gpu_cap_applied, result
    _within(result, BUDGET_MB * MIB)
    assert max(result.gpu_peaks_bytes or ()) >= BUDGET_MB * MIB // 2, "it filled its budget"


@pytest.mark.usefixtures("jax_cuda")
def test_jax_is_held_to_its_fraction_within_and_past_its_budget(
    redis_url: str, gpu_worker: Callable[..., str]
) -> None:
    gpu_worker("--gpus", "0", "--trials-per-gpu", "1", "--gpu-memory-mb", str(BUDGET_MB))

    fits, too_big = _run(redis_url, "gpu", [_jax(BUDGET_MB // 2), _jax(2 * BUDGET_MB)])

    assert fits.outcome is Outcome.OK, fits
    assert fits.framework == "jax" and fits.gpu_cap_applied, fits
    _within(fits, BUDGET_MB * MIB)
    assert max(fits.gpu_peaks_bytes or ()) >= BUDGET_MB * MIB // 2
    assert too_big.outcome is Outcome.OOM, too_big
    _within(too_big, BUDGET_MB * MIB)


@pytest.mark.usefixtures("torch_cuda")
def test_two_trials_packed_on_one_gpu_both_complete_each_within_its_budget(
    redis_url: str, gpu_worker: Callable[..., str], host_gpus: tuple[Gpu, ...]
) -> None:
    gpu_worker("--gpus", "0", "--trials-per-gpu", "2")  # the card shared evenly
    budget = _slot_budget(redis_url)
    # what CUDA lets a process have is less than NVML's total, and a measured context more
    # than the assumed one: the even share is at most NVML's total less two assumed contexts
    assert 0 < budget <= (host_gpus[0].total_bytes - 2 * CONTEXT_RESERVE_MB * MIB) // 2
    mb = min(4096, budget // MIB // 4)

    results = _run(redis_url, "gpu", [_torch(mb, hold_s=3.0), _torch(mb, hold_s=3.0)])

    assert [r.outcome for r in results] == [Outcome.OK] * 2, results
    for result in results:
        _within(result, budget)
        assert result.gpu_cap_applied and max(result.gpu_peaks_bytes or ()) >= mb * MIB
    first, second = sorted((float(r.metrics["started"]), float(r.metrics["ended"]))
                           for r in results)  # fmt: skip
    assert second[0] < first[1], "the two trials did not hold the GPU at the same time"
    assert len({r.worker_pid for r in results}) == 2, "one process per trial"


@pytest.mark.usefixtures("torch_cuda")
def test_a_trial_holding_twice_its_budget_ends_oom_while_its_neighbour_completes(
    redis_url: str, gpu_worker: Callable[..., str]
) -> None:
    gpu_worker("--gpus", "0", "--trials-per-gpu", "2", "--gpu-memory-mb", str(BUDGET_MB))

    over, neighbour = _run(redis_url, "gpu", [
        _torch(2 * BUDGET_MB, uncapped=True, hold_s=60.0),  # only the guard can stop it
        _torch(BUDGET_MB // 4, hold_s=5.0),
    ])  # fmt: skip

    assert over.outcome is Outcome.OOM, over
    assert "GPU memory guard" in (over.error or ""), over.error
    assert not over.oom_caused_by_neighbour
    assert neighbour.outcome is Outcome.OK, neighbour
    _within(neighbour, BUDGET_MB * MIB)
    assert not neighbour.oom_caused_by_neighbour


@pytest.mark.usefixtures("torch_cuda")
def test_a_two_gpu_trial_sees_two_devices_and_has_peaks_on_each(
    redis_url: str, gpu_worker: Callable[..., str], host_gpus: tuple[Gpu, ...]
) -> None:
    if len(host_gpus) < 2:
        pytest.skip(f"a trial of 2 GPUs needs 2; this host has {len(host_gpus)}")
    gpu_worker("--gpus", "0,1", "--gpus-per-trial", "2", "--gpu-memory-mb", str(BUDGET_MB))

    (result,) = _run(redis_url, trial_queue("gpu", gpus=2), [_torch(BUDGET_MB // 4)])

    assert result.outcome is Outcome.OK, result
    assert result.metrics["devices"] == 2
    assert result.gpu_peaks_bytes is not None and len(result.gpu_peaks_bytes) == 2
    _within(result, BUDGET_MB * MIB)
    assert len(result.gpu_process_peak_bytes) == 2, result.gpu_process_peak_bytes


def _spec(path: Path, gpu_memory_mb: int) -> Path:
    path.write_text(
        f'[study]\nname = "real-gpu-routing"\ndirection = "maximize"\nn_trials = 1\n'
        f'storage = "sqlite:///{path.parent / "study.db"}"\n'
        f'[trial]\nentrypoint = "gpu_trials:torch_allocates"\nqueue = "gpu"\n'
        f"timeout_s = 60\ngpu_memory_mb = {gpu_memory_mb}\n"
        '[space.mb]\ntype = "categorical"\nchoices = [128]\n'
    )
    return path


def test_routing_refuses_a_study_that_needs_more_memory_than_every_slot_has(
    redis_url: str, tmp_path: Path, gpu_worker: Callable[..., str], host_gpus: tuple[Gpu, ...]
) -> None:
    gpu_worker("--gpus", "0", "--trials-per-gpu", "2")
    too_big_mb = host_gpus[0].total_bytes // MIB + 1024  # more than the whole card
    spec = _spec(tmp_path / "study.toml", too_big_mb)
    path = os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    command = [sys.executable, "-c", "import sys; from trialq.cli import submit_study_main; "
               "sys.exit(submit_study_main(sys.argv[1:]))", str(spec), "--broker", redis_url,
               "--no-progress"]  # fmt: skip

    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: submit-study: no live worker on queue")
    assert f"1 GPU with {too_big_mb} MB" in lines[0], lines[0]
