"""The Celery edge on the worker side: the app, its settings, and the `trialq.run_trial` task.

`celery -A trialq.worker worker` and `trialq worker` both start this app. The settings here
carry the design: one trial per process, one message reserved at a time, acknowledged only
after the trial ends, JSON only. The worker's parent may import TensorFlow (`preload`) but
never initialises it or a GPU: it checks that before every fork, and each child at its start.

What a worker holds (its settings, its app, the device baseline, the heartbeat, the running
trial's beacon and Redis client) lives on one `WorkerState`, built from the `Settings` it is
given. Celery's signals reach it through one handler per signal, each calling the state's
steps in the order it states, so nothing depends on the order Celery connects handlers in.

A worker that owns GPUs (`TRIALQ_GPUS`, `trialq worker --gpus`) cuts them into trial slots
(`trialq.trial.gpu_plan`) before its pool forks; each trial process takes a slot, puts the
slot's `GpuShare` into its environment before anything imports CUDA, checks its GPUs hold no
stranger's memory (`NeighbourCheck`), and runs under its GPU memory guard (`GpuGuard`).
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from contextvars import Token
from typing import Any

import redis
from celery import Celery, signals
from celery.exceptions import Ignore, SoftTimeLimitExceeded, WorkerShutdown
from celery.worker import state as worker_state

from trialq import logs
from trialq._celery.app import TASK_NAME, create_app
from trialq._celery.pool import claim_trial_slot
from trialq.errors import TrialqError, UsageError
from trialq.lifeline import die_with_parent
from trialq.settings import Settings, redacted_url
from trialq.trial import checkpoints, process_group
from trialq.trial.device import TensorFlowDevice
from trialq.trial.gpu_guard import GpuGuard, GpuOverrun
from trialq.trial.gpu_inventory import Nvml
from trialq.trial.gpu_plan import GpuPlan
from trialq.trial.gpu_share import GpuShare
from trialq.trial.prewarm import device_in_use, preload, preload_modules
from trialq.trial.runner import run_trial
from trialq.trial.telemetry import MIB, DeviceBaseline, NeighbourCheck
from trialq.wire.channel import ReportChannel, TrialAddress
from trialq.wire.heartbeat import GpuBeat, Heartbeat, RunningTrial, TrialBeacon, WorkerBeat
from trialq.wire.keys import DEFAULT_QUEUE, result_key, results_channel, withdrawn_key
from trialq.wire.messages import Outcome, TrialRequest, TrialResult

EX_SOFTWARE = 70
"""Exit status of a worker, or a pool child, that refuses to go on (os.EX_SOFTWARE)."""

RESULT_RETRY_DELAYS_S = (0, 0.5, 1, 2, 4, 8, 15, 30, 30, 30)
"""Waits before each try to store a trial's result: a Redis restart is ridden out for 2 min."""

logger = logging.getLogger("trialq.worker")  # the name log lines show; kept when the module moved


class WorkerState:
    """One worker's state and the steps Celery's signals run on it.

    Built in the worker's parent from the `Settings` it is given; each trial process inherits
    it through the fork and fills in what belongs to its trial (its Redis client, beacon and
    log context).
    """

    result_retry_delays_s: tuple[float, ...] = RESULT_RETRY_DELAYS_S

    def __init__(self, settings: Settings, app: Celery | None = None) -> None:
        self.settings = settings
        self.app = app if app is not None else create_app(settings)
        self.baseline: DeviceBaseline | None = None
        self.gpu_shares: tuple[GpuShare, ...] | None = None
        """The shares of the worker's GPUs its slots give their trials; None before
        `plan_gpus`, empty for a worker without `--gpus`."""
        self.heartbeat: Heartbeat | None = None
        self._redis: redis.Redis | None = None
        self._beacon: TrialBeacon | None = None
        self._log_token: Token[Mapping[str, str]] | None = None

    def trial_redis(self) -> redis.Redis:
        """The trial process's Redis (connected after the fork, never inherited): the result
        backend's client when the backend is the broker, so that a trial opens one connection."""
        if self._redis is None:
            if self.settings.backend_url == self.settings.broker_url:
                self._redis = self.app.backend.client
            else:
                self._redis = redis.Redis.from_url(self.settings.broker_url)
        return self._redis

    # The task: one trial attempt in this (fresh) process.

    def run_task(self, task_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Run one trial attempt and return its `TrialResult` as JSON (stored first)."""
        request = self.own_import_paths(TrialRequest.model_validate(payload))
        if self.trial_redis().exists(withdrawn_key(task_id), result_key(task_id)):
            # Withdrawn by the driver, or a redelivery of a trial that already ended: not run.
            raise Ignore()
        share = _take_slot()
        channel = ReportChannel(self.trial_redis())
        root = self.settings.checkpoint_root or checkpoints.default_root()
        result = self._run_on_share(request, task_id, share, channel, root)
        message = self.bounded_json(result)
        self.keep_result(request, task_id, message)
        with contextlib.suppress(OSError, redis.RedisError):
            checkpoints.remove_orphans(channel, root)  # after the result: off the trial's time
        if result.device_refused:
            _stop_taking_trials()
        return json.loads(message)  # type: ignore[no-any-return]

    def own_import_paths(self, request: TrialRequest) -> TrialRequest:
        """The request with this worker's import paths (`TRIALQ_IMPORT_PATHS`), whatever the
        message said: a sender must not choose where an allowed module is imported from."""
        return request.model_copy(update={"search_paths": self.settings.import_paths})

    def _run_on_share(
        self,
        request: TrialRequest,
        task_id: str,
        share: GpuShare | None,
        channel: ReportChannel,
        root: Any,
    ) -> TrialResult:
        """The trial on its slot's GPUs: refused where a stranger holds them, else run under
        the GPU memory guard, its own OOM told apart from one its neighbours caused."""
        nvml = Nvml.open(self.settings.nvml_module) if share is not None else None
        if nvml is None or share is None:
            return self._run(request, channel, root, share)
        with nvml:
            tolerance = self.settings.gpu_baseline_tolerance_mb * MIB
            refusal = NeighbourCheck(tolerance).refusal(nvml, share)
            if refusal is not None:
                return _device_refused(request, refusal)
            reserve = self.settings.gpu_context_reserve_mb * MIB
            with GpuGuard(nvml, share, reserve, self._leave_oom(request, task_id)) as guard:
                result = self._run(request, channel, root, share)
            neighbours = result.outcome is Outcome.OOM and guard.neighbour_caused()
            return result.with_gpu_guard(guard.peaks(), neighbours)

    def _leave_oom(self, request: TrialRequest, task_id: str) -> Callable[[GpuOverrun], None]:
        """What the GPU memory guard does before it kills the trial's process: store its
        result, `oom` (once: the trial's memory grows while Redis is waited for)."""

        def leave(overrun: GpuOverrun) -> None:
            logger.error("%s", overrun.text())
            peaks = {overrun.device: overrun.used_bytes}
            result = TrialResult.here(
                request, Outcome.OOM, overrun.text(), gpu_process_peak_bytes=peaks
            )
            with contextlib.suppress(redis.RedisError):
                self.trial_redis().set(
                    result_key(task_id), result.model_dump_json(), ex=self.settings.key_ttl_s
                )

        return leave

    def _run(
        self, request: TrialRequest, channel: ReportChannel, root: Any, share: GpuShare | None
    ) -> TrialResult:
        return run_trial(
            request,
            channel=channel,
            device=TensorFlowDevice(),
            allowed_modules=self.settings.allowed_modules,
            timeout_errors=(SoftTimeLimitExceeded,),
            baseline=self.baseline,
            checkpoint_root=root,
            artifact_root=self.settings.artifact_root,
            own_process_group=True,
            gpu=share,
        )

    def keep_result(self, request: TrialRequest, task_id: str, message: str) -> None:
        """Store the result under trialq's own key, waiting out a Redis restart if needed,
        then announce it on the study's results channel: a driver waiting wakes at once."""
        error: redis.RedisError | None = None
        for delay in self.result_retry_delays_s:
            time.sleep(delay)
            try:
                self.trial_redis().set(result_key(task_id), message, ex=self.settings.key_ttl_s)
                self._announce_result(request, task_id)
                return
            except redis.RedisError as exc:
                error = exc
        logger.error(
            "result of trial %d of study %r (attempt %d, task %s) not stored: Redis refused "
            "%d tries over %g s, last with: %s",
            request.number, request.study, request.attempt, task_id,
            len(self.result_retry_delays_s), sum(self.result_retry_delays_s), error,
        )  # fmt: skip

    def _announce_result(self, request: TrialRequest, task_id: str) -> None:
        """Publish the stored result's task id (best effort: a driver that misses it finds
        the result at its next pass anyway)."""
        with contextlib.suppress(redis.RedisError):
            self.trial_redis().publish(results_channel(request.study), task_id)

    def bounded_json(self, result: TrialResult) -> str:
        """The result as JSON; one too large to store keeps the outcome's facts, not the
        metrics."""
        message = result.model_dump_json()
        limit = self.settings.max_result_bytes
        if len(message) <= limit:
            return message
        refused = f"result of {len(message)} bytes refused (limit {limit})"
        return result.unstorable(refused).model_dump_json()

    # The worker's parent, starting.

    def preload(self) -> None:
        """Import the framework in the parent, before the pool forks (`trialq worker` did
        already)."""
        try:
            preload(preload_modules(self.settings.preload))
        except TrialqError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(exc.exit_code) from None

    def plan_gpus(self) -> tuple[GpuShare, ...]:
        """The worker's GPUs cut into its slots' shares (read from NVML once, in the parent
        before the pool forks, and let go), published on the app for the pool."""
        if self.gpu_shares is None:
            self.gpu_shares = self._read_gpu_shares()
            self.app.conf.trialq_gpu_shares = self.gpu_shares
        return self.gpu_shares

    def _read_gpu_shares(self) -> tuple[GpuShare, ...]:
        settings = self.settings
        if not settings.gpus:
            return ()
        nvml = Nvml.open(settings.nvml_module)
        if nvml is None:
            raise UsageError(f"--gpus {settings.gpus}: no NVML here ({settings.nvml_module})")
        plan = GpuPlan(
            settings.trials_per_gpu, settings.gpus_per_trial, settings.gpu_memory_mb,
            settings.gpu_context_reserve_mb,
        )  # fmt: skip
        with nvml:
            return plan.shares(nvml.gpus(settings.gpus))

    def gpu_beat(self) -> GpuBeat | None:
        """What the heartbeat says of the worker's GPUs and slots; None without `--gpus`."""
        shares = self.plan_gpus()
        if not shares:
            return None
        devices = tuple(dict.fromkeys(d for share in shares for d in share.devices))
        first = shares[0]
        return GpuBeat(
            devices=devices, model=first.model or "unknown", total_bytes=first.total_bytes or 0,
            slots=len(shares), gpus_per_slot=len(first.devices),
            slot_budget_bytes=first.budget_bytes,
        )  # fmt: skip

    def measure_device_baseline(self) -> None:
        """Before the pool forks any trial process: the memory a clean device holds. Not for
        a worker that packs trials onto its GPUs: its neighbours' memory is there by right,
        and each trial checks its GPUs' processes instead (`NeighbourCheck`)."""
        if self.plan_gpus():
            return
        tolerance = self.settings.gpu_baseline_tolerance_mb * MIB
        self.baseline = DeviceBaseline.measure(TensorFlowDevice(), tolerance)

    def start_heartbeat(self, consumer: Any) -> None:
        """Beat for this worker in Redis (and its heartbeat file) until it shuts down."""
        queues = tuple(sorted(consumer.app.amqp.queues.consume_from or [DEFAULT_QUEUE]))
        beat = WorkerBeat(
            name=consumer.hostname,
            host=socket.gethostname(),
            pid=os.getpid(),
            queues=queues,
            gpu=self.settings.cuda_visible_devices,
            beat_at=0.0,
            gpus=self.gpu_beat(),
        )
        client = redis.Redis.from_url(self.settings.broker_url, socket_timeout=5)
        interval, ttl = self.settings.heartbeat_interval_s, self.settings.heartbeat_ttl_s
        self.heartbeat = Heartbeat(client, beat, interval, ttl, mark=self.settings.heartbeat_file)
        self.heartbeat.start()
        logger.info(
            "worker %s ready: broker %s, queues %s, %d trial(s) at a time",
            beat.name,
            redacted_url(self.settings.broker_url),
            ",".join(queues),
            consumer.pool.num_processes if consumer.pool is not None else 1,
        )

    def stop_heartbeat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()

    # A trial process, around its trial.

    def prepare_trial_process(self) -> None:
        """A new child, before it takes a trial: refuse inherited device state, then connect.

        A spare child waits idle for its trial, so it opens its Redis connections now rather
        than on the trial's time. It dies with the worker (`trialq.lifeline`): a trial whose
        worker is gone is retried elsewhere, and must not hold the GPU meanwhile.
        """
        die_with_parent(signal.SIGKILL)
        reason = device_in_use()
        if reason is not None:
            logger.critical("pool child %d exits unused: %s before the fork", os.getpid(), reason)
            os._exit(EX_SOFTWARE)
        with contextlib.suppress(redis.RedisError):
            self.trial_redis().ping()
            if self.trial_redis() is not self.app.backend.client:
                self.app.backend.client.ping()

    def claim_trial(self, hostname: str, task_id: str, payload: dict[str, Any]) -> None:
        """Tell `trialq status` which trial this worker now runs, and name it on every log
        line until the task ends (Celery's 'succeeded' line included)."""
        running = _running_trial(hostname, task_id, payload)
        self._log_token = logs.enter_trial(running)
        interval, ttl = self.settings.heartbeat_interval_s, self.settings.heartbeat_ttl_s
        self._beacon = TrialBeacon(
            self.trial_redis(), running, interval, ttl, on_kill=_end_given_up_attempt
        ).start()

    def release_trial(self) -> None:
        """The trial is over, whatever its outcome: this worker no longer runs it."""
        if self._beacon is not None:
            self._beacon.stop()
            self._beacon = None
        if self._log_token is not None:
            logs.leave_trial(self._log_token)
            self._log_token = None

    # The worker's parent, stopping.

    def preempt_running_trials(self) -> None:
        """SIGTERM (warm shutdown): tell each running trial to save and return, at once, and
        with `stop_grace_s` set, kill what still runs that much later, before the platform
        kills the whole worker.

        Celery's warm shutdown waits for the running task however long it takes; a spot node
        gives 30 s to 2 min. The notice is the attempt's stop flag in Redis, which
        `trial.should_stop()` reads; the driver finds it there too, so an attempt killed after
        it counts as preempted, not as a lost worker. Runs in the parent's signal handler: it
        only writes a few keys and starts a timer thread.
        """
        running = _running_requests()
        if not running:
            return
        self._send_stop_notices([request for request, _pid in running])
        _kill_later([pid for _request, pid in running], self.settings.stop_grace_s)

    def _send_stop_notices(self, requests: list[TrialRequest]) -> None:
        try:
            client = redis.Redis.from_url(self.settings.broker_url, socket_timeout=5)
            channel = ReportChannel(client)
            for request in requests:
                channel.request_stop(TrialAddress(request.study, request.number, request.attempt))
        except redis.RedisError as exc:
            logger.warning("stop notice not sent (Redis: %s); the trials run on until killed", exc)


def _take_slot() -> GpuShare | None:
    """Wait for a trial slot; put its GPUs and budget into this process's environment, before
    anything the trial imports reads `CUDA_VISIBLE_DEVICES`."""
    slot = claim_trial_slot()
    share = slot.gpu if slot is not None else None
    if share is not None:
        os.environ.update(share.environment())
    return share


def _device_refused(request: TrialRequest, reason: str) -> TrialResult:
    """The result of a trial not run: a process that is none of this worker's holds its GPU."""
    logger.critical("%s", reason)
    return TrialResult.device_refused_here(request, reason)


def _stop_taking_trials() -> None:
    """Warm-shut the worker down: its device is not clean, so no trial should go to it.

    A container restart (compose's restart policy, Kubernetes) ends whatever process in it
    still holds the device, and the new worker measures a clean baseline.
    """
    logger.critical("device not back to its baseline; this worker stops taking trials")
    os.kill(os.getppid(), signal.SIGTERM)


def _refuse_fork_after_device_use() -> None:
    """The parent is about to fork a trial process: never with a device initialised."""
    reason = device_in_use()
    if reason is not None:
        logger.critical("worker stops: %s in its parent; no trial process is forked", reason)
        raise WorkerShutdown(EX_SOFTWARE)


def _freeze_started_worker() -> None:
    """Move what the worker built while starting out of the collector's sight.

    Celery collects garbage in the parent before every fork (its issue 2927), and with one
    process per trial that is before every trial: walking the consumer, the pool and the
    connections each time cost the parent 3 ms a trial. They live as long as the worker.
    """
    gc.collect()
    gc.freeze()


def _running_trial(worker: str, task_id: str, payload: dict[str, Any]) -> RunningTrial:
    request = TrialRequest.model_validate(payload)
    return RunningTrial(
        worker=worker,
        study=request.study,
        number=request.number,
        attempt=request.attempt,
        task_id=task_id,
        pid=os.getpid(),
        started_at=time.time(),
    )


def _running_requests() -> list[tuple[TrialRequest, int]]:
    """The trials this worker runs now, with the pid of each one's process."""
    running = []
    for request in list(worker_state.active_requests):
        pid = getattr(request, "worker_pid", None)
        if getattr(request, "name", None) != TASK_NAME or not pid:
            continue
        try:
            running.append((TrialRequest.model_validate(request.args[0]), int(pid)))
        except (ValueError, IndexError, TypeError):
            continue
    return running


def _kill_later(pids: list[int], grace: float | None) -> None:
    """With a grace set, kill the trials' processes that much later, from a timer thread."""
    if grace is None:
        logger.warning("SIGTERM: %d running trial(s) told to stop", len(pids))
        return
    logger.warning(
        "SIGTERM: %d running trial(s) told to stop; killed in %g s if still running",
        len(pids), grace,
    )  # fmt: skip
    timer = threading.Timer(grace, _kill_trials, args=(pids, grace))
    timer.daemon = True
    timer.start()


def _kill_trials(pids: list[int], grace: float) -> None:
    """The grace is over: end what still runs, so the worker exits before it is killed."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
            logger.warning("trial process %d killed %g s after its stop notice", pid, grace)


worker = WorkerState(Settings())
"""The worker `celery -A trialq.worker worker` and `trialq worker` run: its settings are read
from the environment once, here, where Celery imports the app."""
app = worker.app


class _BrokerNamedPlainly(logging.Filter):
    """Celery's "Connected to <broker>" names the broker through kombu, which shows a
    password (`redis://:**@`) where there is none and the transport's class path as the
    scheme: the line names the settings' URL instead, its password hidden."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = redacted_url(url)

    def filter(self, record: logging.LogRecord) -> bool:
        """Never drops a record; only rewrites that one line's URL."""
        if record.msg == "Connected to %s":
            record.args = (self.url,)
        return True


logging.getLogger("celery.worker.consumer.connection").addFilter(
    _BrokerNamedPlainly(worker.settings.broker_url)
)


@app.task(name=TASK_NAME, bind=True, acks_late=True)
def run_trial_task(self: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """Run one trial attempt in this (fresh) process and return its `TrialResult` as JSON."""
    return worker.run_task(self.request.id, payload)


# One handler per signal; each runs the worker's steps in the order it states.


@signals.after_setup_logger.connect
def _on_after_setup_logger(logger: logging.Logger, **_: Any) -> None:
    """Every worker line, Celery's too, names its study, trial and attempt (or `-`)."""
    logs.adopt_handlers(logger)


@signals.worker_init.connect
def _on_worker_init(**_: Any) -> None:
    """Before the pool forks: import the framework (a refused import stops the worker before
    anything reads the device), then cut the GPUs into slots, then measure the memory a clean
    device holds."""
    worker.preload()
    worker.plan_gpus()
    worker.measure_device_baseline()


@signals.worker_before_create_process.connect
def _on_worker_before_create_process(**_: Any) -> None:
    _refuse_fork_after_device_use()


@signals.worker_process_init.connect
def _on_worker_process_init(**_: Any) -> None:
    worker.prepare_trial_process()


@signals.worker_ready.connect
def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    """Started: freeze what starting built, then start the heartbeat (whose thread and
    client are not among what is frozen)."""
    _freeze_started_worker()
    worker.start_heartbeat(sender)


@signals.task_prerun.connect
def _on_task_prerun(sender: Any = None, task_id: str = "", args: Any = (), **_: Any) -> None:
    if getattr(sender, "name", None) == TASK_NAME:
        worker.claim_trial(sender.request.hostname, task_id, args[0])


@signals.task_postrun.connect
def _on_task_postrun(**_: Any) -> None:
    worker.release_trial()


@signals.worker_shutting_down.connect
def _on_worker_shutting_down(how: str = "", **_: Any) -> None:
    """A cold shutdown ends the trials at once (the driver sees them lost); a warm one
    (SIGTERM) tells them to stop first."""
    if how == "Warm":
        worker.preempt_running_trials()


@signals.worker_shutdown.connect
def _on_worker_shutdown(**_: Any) -> None:
    worker.stop_heartbeat()


def _end_given_up_attempt() -> None:
    """The driver gave up on this attempt (it re-sent it or told it lost while this process
    was cut off): end the process and everything it started, at once."""
    logger.warning("the driver gave up on this attempt: ending its process group")
    process_group.kill_own_group()
