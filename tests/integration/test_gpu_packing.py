"""Several trials per GPU, trials of several GPUs, and routing by GPU, with real worker
processes and real Redis on FAKE GPUs (`tests/fake_nvml.py`): the memory figures here are a
fake's, written by fake trials, never a GPU's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import fake_nvml
import optuna
import pytest
import redis
from trial_requests import trial_request
from waiting import wait_until

from trialq._celery.dispatcher import CeleryDispatcher
from trialq.gpu.plan import CONTEXT_RESERVE_MB
from trialq.settings import Settings
from trialq.wire import heartbeat
from trialq.wire.dispatch import TaskPhase, TaskStatus
from trialq.wire.keys import queue_running_key
from trialq.wire.messages import Outcome
from trialq.wire.routing import trial_queue

pytestmark = pytest.mark.integration

TESTS_DIR = Path(__file__).resolve().parent.parent
GIB = 2**30
MIB = 2**20
FAKE_TOTAL = 16 * GIB
"""Each fake GPU's memory: a fake's figure."""
RESERVE_MB = CONTEXT_RESERVE_MB
"""The context each slot sets aside: the fake GPUs are not measured, so it is assumed."""
WAIT_S = 90.0


def _slot_gib(trials_per_gpu: int) -> str:
    """A fake GPU's even share, as the worker's lines write it."""
    return f"{(FAKE_TOTAL - trials_per_gpu * RESERVE_MB * MIB) / trials_per_gpu / GIB:.1f} GiB"


@pytest.fixture
def fake_gpus(tmp_path: Path) -> Callable[[int], Path]:
    """Describe N fake GPUs of 16 GiB in a folder of their own; its path."""

    def describe(count: int) -> Path:
        folder = tmp_path / "fake-nvml"
        fake_nvml.describe(folder, count, FAKE_TOTAL)
        return folder

    return describe


@pytest.fixture
def gpu_worker(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start one `trialq worker --gpus ...` on fake GPUs; its name. Stopped afterwards."""
    started: list[subprocess.Popen[bytes]] = []

    def start(nvml_dir: Path, *flags: str, env: dict[str, str] | None = None) -> str:
        name = f"fake-gpu-{len(started)}@test"
        env = {
            **os.environ,
            **(env or {}),
            "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
            "TRIALQ_BROKER_URL": redis_url, "TRIALQ_RESULT_BACKEND": redis_url,
            "TRIALQ_ALLOWED_MODULES": "fake_gpu_trials", "TRIALQ_PRELOAD": "none",
            "TRIALQ_NVML_MODULE": "fake_nvml", "FAKE_NVML_DIR": str(nvml_dir),
            "TRIALQ_HEARTBEAT_INTERVAL_S": "0.5",
        }  # fmt: skip
        command = [sys.executable, "-m", "trialq", "worker", "--queue", "gpu",
                   "--hostname", name, "--loglevel", "WARNING", *flags]  # fmt: skip
        log = (tmp_path / f"worker{len(started)}.log").open("wb")
        worker = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
        started.append(worker)
        client = redis.Redis.from_url(redis_url)
        wait_until(
            lambda: worker.poll() is not None or heartbeat.is_alive(client, name),
            60, "the fake-GPU worker's heartbeat",
        )  # fmt: skip
        assert worker.poll() is None, (tmp_path / f"worker{len(started) - 1}.log").read_text()
        return name

    yield start
    for worker in started:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def _run(redis_url: str, queue: str, requests: list[dict[str, object]]) -> list[TaskStatus]:
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url))
    ids = [
        dispatcher.submit(trial_request(study="fake-gpu", number=n, **fields), queue)
        for n, fields in enumerate(requests)
    ]

    def finished() -> dict[str, TaskStatus] | None:
        statuses = dispatcher.statuses(ids)
        final = (TaskPhase.FINISHED, TaskPhase.FAILED)
        return statuses if all(s.phase in final for s in statuses.values()) else None

    statuses = wait_until(finished, WAIT_S, lambda: f"trials to end: {dispatcher.statuses(ids)}")
    return [statuses[task_id] for task_id in ids]


def _records(folder: Path) -> list[dict[str, object]]:
    return [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]


def test_each_slot_has_its_own_devices_and_budget_and_packed_trials_all_run(
    redis_url: str, tmp_path: Path, fake_gpus: Callable[[int], Path], gpu_worker: Callable[..., str]
) -> None:
    gpu_worker(fake_gpus(2), "--gpus", "all", "--trials-per-gpu", "2")
    log = tmp_path / "records"
    log.mkdir()
    # 6 s each: two trials given one GPU start within it of each other on a loaded host.
    params = {"log": str(log), "hold_mb": 1000, "sleep_s": 6.0}
    entry = "fake_gpu_trials:records_its_gpu"

    statuses = _run(redis_url, "gpu", [{"entrypoint": entry, "params": params}] * 4)

    results = [status.result for status in statuses]
    assert [r.outcome if r else None for r in results] == [Outcome.OK] * 4, results
    records = _records(log)
    # Named by UUID, as the worker guards them: never an index CUDA may order otherwise.
    assert sorted(str(r["visible"]) for r in records) == ["GPU-fake-0"] * 2 + ["GPU-fake-1"] * 2
    expected = (FAKE_TOTAL - 2 * RESERVE_MB * MIB) // 2
    assert {int(str(r["budget"])) for r in records} == {expected}
    # Two trials on one GPU at once: each saw the other's memory, and neither was refused.
    on_gpu0 = sorted((float(str(r["started"])), float(str(r["ended"]))) for r in records
                     if r["visible"] == "GPU-fake-0")  # fmt: skip
    assert on_gpu0[1][0] < on_gpu0[0][1], "the two trials on GPU 0 did not overlap"


def test_an_over_budget_trial_is_killed_as_gpu_guard_never_oom_while_its_neighbour_completes(
    redis_url: str, tmp_path: Path, fake_gpus: Callable[[int], Path], gpu_worker: Callable[..., str]
) -> None:
    gpu_worker(fake_gpus(1), "--gpus", "0", "--trials-per-gpu", "2")
    log = tmp_path / "records"
    log.mkdir()
    neighbour = {"log": str(log), "hold_mb": 2000, "sleep_s": 4.0}

    over, ok = _run(redis_url, "gpu", [
        {"entrypoint": "fake_gpu_trials:overruns_its_budget", "params": {}},
        {"entrypoint": "fake_gpu_trials:records_its_gpu", "params": neighbour},
    ])  # fmt: skip

    assert over.result is not None and over.result.outcome is Outcome.GPU_GUARD, over
    assert "GPU memory guard" in (over.result.error or "")
    figures = over.result.gpu_guard
    assert figures is not None and figures.budget_bytes == over.result.gpu_budget_bytes
    assert figures.outside_bytes > figures.allowance_bytes  # growth it can name, named
    assert not over.result.oom_caused_by_neighbour
    assert ok.result is not None and ok.result.outcome is Outcome.OK, ok
    assert ok.result.gpu_process_peak_bytes == {"GPU-fake-0": 2000 * MIB}  # `--gpus 0`


def test_a_two_gpu_trial_sees_two_devices(
    redis_url: str, tmp_path: Path, fake_gpus: Callable[[int], Path], gpu_worker: Callable[..., str]
) -> None:
    gpu_worker(fake_gpus(2), "--gpus", "all", "--gpus-per-trial", "2")
    log = tmp_path / "records"
    log.mkdir()
    params = {"log": str(log), "hold_mb": 500, "sleep_s": 0.5}

    (status,) = _run(redis_url, trial_queue("gpu", gpus=2), [
        {"entrypoint": "fake_gpu_trials:records_its_gpu", "params": params},
    ])  # fmt: skip

    assert status.result is not None and status.result.outcome is Outcome.OK, status
    assert [r["visible"] for r in _records(log)] == ["GPU-fake-0,GPU-fake-1"]
    peaks = {"GPU-fake-0": 500 * MIB, "GPU-fake-1": 500 * MIB}
    assert status.result.gpu_process_peak_bytes == peaks


def _spec(path: Path, entrypoint: str, gpu_memory_mb: int, **trial: object) -> Path:
    extra = "".join(f"{key} = {value}\n" for key, value in trial.items())
    path.write_text(
        f'[study]\nname = "fake-gpu-routing"\ndirection = "maximize"\nn_trials = 1\n'
        f'storage = "sqlite:///{path.parent / "study.db"}"\n'
        f'[trial]\nentrypoint = "{entrypoint}"\nqueue = "gpu"\ntimeout_s = 60\n'
        f"gpu_memory_mb = {gpu_memory_mb}\n{extra}"
        '[space.x]\ntype = "float"\nlow = 0\nhigh = 1\n'
    )
    return path


def _submit(spec: Path, redis_url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(TESTS_DIR)}
    command = [sys.executable, "-c", "import sys; from trialq.cli import submit_study_main; "
               "sys.exit(submit_study_main(sys.argv[1:]))", str(spec), "--broker", redis_url,
               "--no-progress"]  # fmt: skip
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def test_a_study_that_no_live_worker_can_fit_is_refused_in_one_line(
    redis_url: str, tmp_path: Path, fake_gpus: Callable[[int], Path], gpu_worker: Callable[..., str]
) -> None:
    gpu_worker(fake_gpus(1), "--gpus", "all", "--trials-per-gpu", "2")
    spec = _spec(tmp_path / "study.toml", "fake_gpu_trials:records_its_gpu", 12000)

    run = _submit(spec, redis_url)

    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: submit-study: no live worker on queue")
    assert "1 GPU with 12000 MB" in lines[0] and f"2 slots of 1 GPU x {_slot_gib(2)}" in lines[0]


def test_a_neighbours_oom_is_sent_again_and_never_told(
    redis_url: str, tmp_path: Path, fake_gpus: Callable[[int], Path], gpu_worker: Callable[..., str]
) -> None:
    gpu_worker(fake_gpus(1), "--gpus", "all", "--trials-per-gpu", "2")
    spec = _spec(tmp_path / "study.toml", "fake_gpu_trials:crowded_out_once", 4000)

    run = _submit(spec, redis_url)  # routed to gpu@1x4g, which the worker's slots fit

    assert run.returncode == 0, run.stderr
    study = optuna.load_study(
        study_name="fake-gpu-routing", storage=f"sqlite:///{tmp_path}/study.db"
    )
    (trial,) = study.trials
    assert trial.state is optuna.trial.TrialState.COMPLETE
    assert trial.user_attrs["attempts"] == 2
    assert trial.user_attrs["retries"] == 0
    assert trial.user_attrs["preemptions"] == 1  # a neighbour's OOM is counted with them
    assert "constraints" not in trial.system_attrs  # nothing was told of an OOM


def test_the_heartbeat_carries_the_gpus_and_slots_and_status_shows_them(
    redis_url: str, tmp_path: Path, fake_gpus: Callable[[int], Path], gpu_worker: Callable[..., str]
) -> None:
    name = gpu_worker(fake_gpus(2), "--gpus", "all", "--trials-per-gpu", "4")
    storage = f"sqlite:///{tmp_path / 'status.db'}"
    optuna.create_study(study_name="shown", storage=storage)

    (beat,) = heartbeat.live_workers(redis.Redis.from_url(redis_url))
    shown = subprocess.run(
        [sys.executable, "-m", "trialq", "status", "shown", "--storage", storage,
         "--broker", redis_url],
        env={**os.environ, "COLUMNS": "300"}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip

    assert beat.name == name and beat.gpus is not None
    assert (beat.gpus.model, beat.gpus.total_bytes) == (fake_nvml.FAKE_NAME, FAKE_TOTAL)
    assert (beat.gpus.slots, beat.gpus.gpus_per_slot) == (8, 1)
    assert beat.gpus.slot_budget_bytes == (FAKE_TOTAL - 4 * RESERVE_MB * MIB) // 4
    assert "gpu@1x2g" in beat.queues and "gpu@1x4g" not in beat.queues
    assert shown.returncode == 0, shown.stderr
    assert (
        f"2 x {fake_nvml.FAKE_NAME} (16.0 GiB), 8 slots of 1 GPU x {_slot_gib(4)}" in shown.stdout
    )


def test_a_running_trial_counts_in_its_queues_running_set_until_it_ends(
    redis_url: str, tmp_path: Path, fake_gpus: Callable[[int], Path], gpu_worker: Callable[..., str]
) -> None:
    """What KEDA reads for a class of workers: the trial delivered on `gpu`'s class queue
    `gpu@1x8g` is in `trialq:queue-running:gpu` while it runs, and gone once it ended."""
    gpu_worker(fake_gpus(1), "--gpus", "all")
    log = tmp_path / "records"
    log.mkdir()
    client = redis.Redis.from_url(redis_url)
    dispatcher = CeleryDispatcher(Settings(broker_url=redis_url))
    request = trial_request(
        study="fake-gpu", number=0, entrypoint="fake_gpu_trials:records_its_gpu",
        params={"log": str(log), "hold_mb": 100, "sleep_s": 4.0},
    )  # fmt: skip
    queue = trial_queue("gpu", 1, gpu_memory_mb=8000)
    assert queue == "gpu@1x8g"
    task_id = dispatcher.submit(request, queue)
    running = queue_running_key("gpu")

    wait_until(lambda: client.zscore(running, task_id) is not None, WAIT_S, "the running claim")
    assert [m.decode() for m in client.zrange(running, 0, -1)] == [task_id]
    final = (TaskPhase.FINISHED, TaskPhase.FAILED)
    wait_until(lambda: dispatcher.statuses([task_id])[task_id].phase in final, WAIT_S, "its end")
    wait_until(lambda: client.zscore(running, task_id) is None, 10, "the claim's release")


def test_a_worker_that_is_an_mps_client_plans_within_its_pinned_limit(
    redis_url: str, tmp_path: Path, fake_gpus: Callable[[int], Path], gpu_worker: Callable[..., str]
) -> None:
    """NVML shows the whole 16 GiB card; MPS lets this client have 4 GiB: the slots' budgets
    and the trials' own pinned limit come from the 4 GiB."""
    limit = {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4G"}
    gpu_worker(fake_gpus(1), "--gpus", "all", "--trials-per-gpu", "2", env=limit)
    log = tmp_path / "records"
    log.mkdir()
    params = {"log": str(log), "hold_mb": 100, "sleep_s": 0.5}

    statuses = _run(redis_url, "gpu", [{"entrypoint": "fake_gpu_trials:records_its_gpu",
                                        "params": params}] * 2)  # fmt: skip

    assert [s.result.outcome if s.result else None for s in statuses] == [Outcome.OK] * 2
    records = _records(log)
    assert {int(str(r["budget"])) for r in records} == {(4 * GIB - 2 * RESERVE_MB * MIB) // 2}
    # Its own limit, counted from its device: its budget plus one context, not the worker's.
    assert {r["mps_limit"] for r in records} == {"0=2048M"}


def test_a_worker_with_the_interposer_preloaded_hands_each_trial_its_budget_as_its_limit(
    redis_url: str, tmp_path: Path, fake_gpus: Callable[[int], Path], gpu_worker: Callable[..., str]
) -> None:
    """The real interposer needs a GPU: a STAND-IN library (libm, harmless) is preloaded in
    its place, and each trial process must carry the interposer's limit and a cache file of
    its own, with the worker's preload inherited (trials are forked, not executed)."""
    stand_in = next(
        line.split()[-1]
        for line in Path("/proc/self/maps").read_text().splitlines()
        if "/libm.so" in line or "/libm-" in line
    )
    env = {"LD_PRELOAD": stand_in, "TRIALQ_GPU_INTERPOSER": stand_in}
    gpu_worker(fake_gpus(1), "--gpus", "all", "--trials-per-gpu", "2", env=env)
    log = tmp_path / "records"
    log.mkdir()
    params = {"log": str(log), "hold_mb": 100, "sleep_s": 0.5}

    statuses = _run(redis_url, "gpu", [{"entrypoint": "fake_gpu_trials:records_its_gpu",
                                        "params": params}] * 2)  # fmt: skip

    assert [s.result.outcome if s.result else None for s in statuses] == [Outcome.OK] * 2
    records = _records(log)
    assert {r["interposer_limit"] for r in records} == {r["budget"] for r in records}
    caches = {str(r["interposer_cache"]) for r in records}
    assert len(caches) == 2 and all(
        f"trialq-vgpu-{r['pid']}" in str(r["interposer_cache"]) for r in records
    )
