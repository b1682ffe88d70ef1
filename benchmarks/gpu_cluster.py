"""A real GPU worker for `python -m benchmarks.gpu`: an embedded Redis, one
`trialq worker --gpus all --trials-per-gpu N` process (or a second on the first's Redis, in a
PID namespace of its own if asked), studies run against it from this process, and NVML
sampled beside them.

Each worker is started in a process session of its own and ended by that session's id, never
by name; where `TRIALQ_BENCH_PIDFILE` names a file, its id is added there, so a command that
cut this process short ends the workers it left, and no one else's."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from benchmarks.gpu_trials import nvml
from trialq.local import LocalCluster
from trialq.settings import Settings
from trialq.submit import submit_study
from trialq.wire import heartbeat

ROOT = Path(__file__).resolve().parents[1]
STARTUP_S = 120.0
GONE_S = 10.0
METRIC = {
    "small": ("val_accuracy", "maximize"),
    "mid": ("loss", "minimize"),
    "hog_or_train": ("val_accuracy", "maximize"),
    "jax_over_budget": ("value", "maximize"),
    "tiny_torch": ("value", "maximize"),
    "resnet": ("loss", "minimize"),
    "keras_digits": ("val_accuracy", "maximize"),
    "stand_in": ("loss", "minimize"),
}
"""Each benchmark trial's objective, as its spec names it."""


class GpuWorker:
    """An embedded Redis and one worker owning every GPU with `per_gpu` trial slots each."""

    def __init__(
        self, per_gpu: int, env: dict[str, str] | None = None, beside: GpuWorker | None = None,
        wrap: tuple[str, ...] = (),
    ) -> None:  # fmt: skip
        """`beside`: share that worker's Redis (and queue) instead of starting one; `wrap`: a
        command the worker runs under, e.g. `unshare --pid --fork --mount-proc`."""
        self.per_gpu = per_gpu
        self.folder = Path(tempfile.mkdtemp(prefix="trialq-gpu-bench-"))
        self._beside = beside
        self._redis: LocalCluster = (
            LocalCluster(0, "gpu", (), log_dir=self.folder / "logs") if beside is None
            else beside._redis
        )  # fmt: skip
        self._env = env or {}
        self._wrap = wrap
        self._process: subprocess.Popen[bytes] | None = None
        self.gpu_count = _gpu_count()

    def __enter__(self) -> GpuWorker:
        if self._beside is None:
            self._redis.__enter__()
        live_before = len(heartbeat.live_workers(redis.Redis.from_url(self.broker_url)))
        command = [
            *self._wrap, sys.executable, "-m", "trialq", "worker", "--queue", "gpu",
            "--gpus", "all", "--trials-per-gpu", str(self.per_gpu), "--loglevel", "INFO",
        ]  # fmt: skip
        with (self.folder / "worker.log").open("wb") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=self._environment(),
                cwd=ROOT, start_new_session=True,
            )  # fmt: skip
        pidfile = os.environ.get("TRIALQ_BENCH_PIDFILE")
        if pidfile:
            with open(pidfile, "a", encoding="utf-8") as ids:
                ids.write(f"{self._process.pid}\n")
        self._wait_until_live(live_before)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._process is not None:
            self._end(graceful=exc is None)
        if self._beside is None:
            self._redis.stop()

    def _end(self, graceful: bool) -> None:
        """End the worker's session: a warm shutdown first when it ran to the end, then
        SIGKILL to whatever of the session is left. Under `unshare` the worker is its PID
        namespace's init, which ignores SIGQUIT sent from outside, and `unshare` itself exits
        at it: the group's SIGKILL is what ends it, and the next section finds the GPU free."""
        assert self._process is not None
        if self._process.poll() is None:
            os.killpg(self._process.pid, signal.SIGQUIT if graceful else signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):  # else nothing of the session was left
            os.killpg(self._process.pid, signal.SIGKILL)
        self._process.wait()
        deadline = time.monotonic() + GONE_S  # a SIGKILL lands when it lands: wait for it
        while live_in_session(self._process.pid) and time.monotonic() < deadline:
            time.sleep(0.05)

    @property
    def broker_url(self) -> str:
        return self._redis.broker_url

    def _environment(self) -> dict[str, str]:
        return {
            **os.environ, **self._env,
            "TRIALQ_BROKER_URL": self.broker_url, "TRIALQ_RESULT_BACKEND": self.broker_url,
            "TRIALQ_ALLOWED_MODULES": "benchmarks,trialq.examples",
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }  # fmt: skip

    def _wait_until_live(self, live_before: int) -> None:
        """Until one more worker beats than before it started (a second worker on the
        first's Redis is not live because the first is)."""
        client = redis.Redis.from_url(self.broker_url)
        deadline = time.monotonic() + STARTUP_S
        while len(heartbeat.live_workers(client)) <= live_before:
            if self._process is None or self._process.poll() is not None:
                raise RuntimeError(f"the GPU worker exited; see {self.folder / 'worker.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the GPU worker did not start; see {self.folder / 'worker.log'}"
                )
            time.sleep(0.2)


@dataclass(frozen=True)
class StudyShape:
    """How a benchmark study runs beyond its trials: at most `in_flight` at once (default
    every slot of the worker), the framework named (default found), the pruner."""

    in_flight: int | None = None
    framework: str | None = None
    pruner: str = "none"
    pruner_startup: int | None = None
    """The median pruner's `n_startup_trials`: how many trials end before any is pruned."""


def run_study(
    worker: GpuWorker, entry: str, trials: int, space: dict[str, tuple[float, float]],
    shape: StudyShape = StudyShape(),
) -> dict[str, Any]:  # fmt: skip
    """A study of `trials` trials of `benchmarks.gpu_trials:<entry>` on the worker, all its
    slots busy; `submit-study --json`'s summary, with the wall time as `wall_s`."""
    spec = worker.folder / f"{entry}-{time.monotonic_ns()}.toml"
    spec.write_text(_spec(worker, entry, trials, space, spec.stem, shape))
    started = time.monotonic()
    summary = submit_study(spec, Settings(broker_url=worker.broker_url), None, None, None, False)
    return {**summary, "wall_s": time.monotonic() - started}


def _spec(
    worker: GpuWorker, entry: str, trials: int, space: dict[str, tuple[float, float]], name: str,
    shape: StudyShape = StudyShape(),
) -> str:  # fmt: skip
    metric, direction = METRIC[entry]
    in_flight = shape.in_flight or worker.per_gpu * worker.gpu_count
    startup = shape.pruner_startup
    pruner_args = "" if startup is None else f"pruner_args = {{ n_startup_trials = {startup} }}"
    text = textwrap.dedent(f"""
        [study]
        name = "{name}"
        direction = "{direction}"
        metric = "{metric}"
        n_trials = {trials}
        max_in_flight = {in_flight}
        sampler = "random"
        pruner = "{shape.pruner}"
        {pruner_args}
        storage = "sqlite:///{worker.folder / name}.db"
        [trial]
        entrypoint = "benchmarks.gpu_trials:{entry}"
        timeout_s = 900
        """)
    if shape.framework:
        text += f'framework = "{shape.framework}"\n'
    for key, (low, high) in space.items():
        kind = "int" if isinstance(low, int) and isinstance(high, int) else "float"
        text += f'[space.{key}]\ntype = "{kind}"\nlow = {low}\nhigh = {high}\n'
    return text


class NvmlSampler(threading.Thread):
    """NVML's memory in use on every GPU, every 50 ms, while the block runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.max_used = 0
        self.total = 0
        self._done = threading.Event()

    def __enter__(self) -> NvmlSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self.join()

    def run(self) -> None:
        pynvml = nvml()
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(_gpu_count())]
        while not self._done.wait(0.05):
            for handle in handles:
                info = pynvml.nvmlDeviceGetMemoryInfo(handle)
                self.max_used, self.total = max(self.max_used, int(info.used)), int(info.total)

    def never_over(self) -> bool:
        """The device's memory in use stayed below its total (NVML's own reading)."""
        return 0 < self.max_used < self.total


def live_in_session(session: int) -> list[int]:
    """The live processes of a process session, zombies left out (Linux's /proc)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone while read
        if int(fields[3]) == session and fields[0] != "Z":
            alive.append(int(stat.parent.name))
    return alive


def _gpu_count() -> int:
    pynvml = nvml()
    pynvml.nvmlInit()
    return int(pynvml.nvmlDeviceGetCount())
