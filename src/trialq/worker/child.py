"""A worker's trial process: what it does before its attempt, around it and after it.

The worker's parent (`trialq.worker`) builds one `WorkerChild` in each process its pool
forks, from its settings, its device baseline and its trial slots. The child refuses device
state it inherited, connects to Redis while it waits idle, takes a slot (whose GPU share it
puts into its environment, once, before anything imports CUDA), runs the attempt (guarded on
shared GPUs: `trialq.trial.gpu_attempt`) and leaves its result (`trialq.worker.result_store`).
No Celery here: the task and the signals that call these steps are the Celery edge's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Mapping
from contextvars import Token
from pathlib import Path
from typing import Any

import redis

from trialq import logs
from trialq.gpu.attribution import ProcessView
from trialq.gpu.device import TensorFlowDevice
from trialq.gpu.share import GpuShare
from trialq.gpu.telemetry import DeviceBaseline
from trialq.lifeline import die_with_parent
from trialq.settings import Settings
from trialq.trial import checkpoints, process_group
from trialq.trial.gpu_attempt import GpuLimits, run_on_share
from trialq.trial.runner import CodeGate, run_trial
from trialq.wire.channel import ReportChannel
from trialq.wire.heartbeat import RunningTrial, TrialBeacon
from trialq.wire.keys import result_key, withdrawn_key
from trialq.wire.messages import Outcome, TrialRequest, TrialResult
from trialq.wire.queue_running import QueueClaim
from trialq.wire.signing import stored_result_refusal
from trialq.worker.attempt_log import AttemptLog
from trialq.worker.prewarm import device_in_use
from trialq.worker.result_store import ResultStore
from trialq.worker.slots import TrialSlots, claim_for_trial
from trialq.worker.threads import hold_threads

EX_SOFTWARE = 70
"""Exit status of a pool child that refuses to go on (os.EX_SOFTWARE)."""

logger = logging.getLogger("trialq.worker")  # the name log lines show; kept when the code moved


class WorkerChild:
    """One trial process of a worker, built from what its parent hands it.

    `backend` gives the Celery result backend's Redis client: the trial's own when the
    backend is the broker, so that a trial opens one connection.
    """

    def __init__(
        self,
        settings: Settings,
        backend: Callable[[], redis.Redis],
        slots: TrialSlots | None = None,
        baseline: DeviceBaseline | None = None,
        view: ProcessView = ProcessView.UNKNOWN,
        cpus: int = 1,
    ) -> None:
        self.settings = settings
        self.cpus = cpus
        """The trial's library threads unless its request says (`worker/threads.py`)."""
        self.slots = slots
        self.baseline = baseline
        self.view = view
        """What NVML's process list can be trusted for on this host (the parent's probe)."""
        self._backend = backend
        self._redis: redis.Redis | None = None
        self._beacon: TrialBeacon | None = None
        self._log_token: Token[Mapping[str, str]] | None = None
        self.stored_result_of: str | None = None
        """The task whose result this process stored under trialq's own key (the last run)."""
        self.withdrawn_of: str | None = None
        """The task this process took and did not run, its driver having withdrawn it: its
        queue's edge records it withdrawn, so that it never reads as started for good."""
        self._attempt_log: AttemptLog | None = None
        self.results = ResultStore(
            self.redis, settings.key_ttl_s, settings.max_result_bytes, settings.seal
        )

    def redis(self) -> redis.Redis:
        """This process's Redis (connected after the fork, never inherited)."""
        if self._redis is None:
            if self.settings.backend_url == self.settings.broker_url:
                self._redis = self._backend()
            else:
                self._redis = redis.Redis.from_url(self.settings.broker_url)
        return self._redis

    def prepare(self) -> None:
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
            self.redis().ping()
            if self.redis() is not self._backend():
                self._backend().ping()

    def claim(
        self, hostname: str, task_id: str, payload: dict[str, Any], routing_key: str | None = None
    ) -> None:
        """Tell `trialq status` which trial this worker now runs, and name it on every log
        line until the task ends (Celery's 'succeeded' line included); with the queue it was
        delivered on (`routing_key`), count it among that queue's running trials (what KEDA
        reads: `trialq.wire.queue_running`)."""
        running = _running_trial(hostname, task_id, payload)
        self._log_token = logs.enter_trial(running)
        if self.settings.trial_log_dir is not None:
            self._attempt_log = AttemptLog(self.settings.trial_log_dir, running).open()
        interval, ttl = self.settings.heartbeat_interval_s, self.settings.heartbeat_ttl_s
        on_queue = QueueClaim.for_delivery(routing_key, task_id) if routing_key else None
        self._beacon = TrialBeacon(
            self.redis(), running, interval, ttl, on_kill=_end_given_up_attempt, claim=on_queue,
            log_file=self._log_file,
        ).start()  # fmt: skip

    @property
    def _log_file(self) -> str | None:
        """The attempt's own log file, where one is being written."""
        log = self._attempt_log
        return str(log.path) if log is not None and log.written else None

    def release(self, returned: bool = True) -> None:
        """The trial is over, whatever its outcome: this worker no longer runs it.
        `returned`: whether its task returned (else it unwinds, the process ending)."""
        if self._beacon is not None:
            self._beacon.stop(returned)
            self._beacon = None
        if self._log_token is not None:
            logs.leave_trial(self._log_token)
            self._log_token = None
        if self._attempt_log is not None:
            self._attempt_log.close()
            self._attempt_log = None

    def run(
        self,
        task_id: str,
        payload: dict[str, Any],
        timeout_errors: tuple[type[BaseException], ...] = (),
    ) -> dict[str, Any] | None:
        """Run one trial attempt and return its `TrialResult` as JSON (stored first); None
        for one not run: withdrawn by the driver, or a redelivery of one that ended."""
        request = TrialRequest.model_validate(payload)
        refusal = self._task_refusal(task_id, payload)
        if refusal is not None:
            return self._refuse(request, task_id, refusal, timeout_errors)
        if self._withdrawn_or_ended(task_id):
            return None
        share = self._take_slot()
        hold_threads(request.cpus or self.cpus)  # before anything the trial imports starts
        channel = ReportChannel(self.redis(), self.settings.key_ttl_s, self.settings.seal)
        root = self.settings.checkpoint_root or checkpoints.default_root()
        limits = GpuLimits(
            self.settings.nvml_module, self.settings.gpu_baseline_tolerance_mb,
            self.settings.gpu_context_reserve_mb, self.settings.gpu_unattributed_wait_s,
            self.view, self.slots.directory if self.slots is not None else None,
        )  # fmt: skip
        result = run_on_share(
            request, share, limits,
            lambda: self._run(request, channel, root, share, timeout_errors),
            lambda oom: self.results.keep_now(task_id, oom),
        )  # fmt: skip
        if self._log_file is not None:
            result = result.model_copy(update={"log_file": self._log_file})
        message = self.results.bounded_json(task_id, result)
        away_until = time.monotonic() + (request.hard_limit_s or request.timeout_s or 0.0)
        _despite(timeout_errors, lambda: self._keep(request, task_id, message, away_until))
        with contextlib.suppress(OSError, redis.RedisError, *timeout_errors):
            checkpoints.remove_orphans(channel, root)  # after the result: off the trial's time
        if result.device_refused:
            _stop_taking_trials()
        return json.loads(message)  # type: ignore[no-any-return]

    def _task_refusal(self, task_id: str, payload: dict[str, Any]) -> str | None:
        """Why this worker will not run the task: with a secret, a request its driver did not
        sign for this task id as it reads now (`trialq.wire.signing.Seal.task_refusal`)."""
        seal = self.settings.seal
        return None if seal is None else seal.task_refusal(task_id, payload)

    def _refuse(
        self,
        request: TrialRequest,
        task_id: str,
        refusal: str,
        timeout_errors: tuple[type[BaseException], ...],
    ) -> dict[str, Any]:
        """Run nothing; leave a signed `refused` result naming why, so that the driver sends
        its own request again (a run of refusals stops the run: `max_failures_in_a_row`)."""
        logger.warning("task %s refused, nothing runs: %s", task_id, refusal)
        reason = f"the task was refused by worker {socket.gethostname()}: {refusal}"
        result = TrialResult.here(request, Outcome.REFUSED, reason)
        message = self.results.bounded_json(task_id, result)
        away_until = time.monotonic() + (request.hard_limit_s or request.timeout_s or 0.0)
        _despite(timeout_errors, lambda: self._keep(request, task_id, message, away_until))
        return json.loads(message)  # type: ignore[no-any-return]

    def _keep(self, request: TrialRequest, task_id: str, message: str, away_until: float) -> None:
        """Store the result under trialq's key, and remember whether it is there."""
        kept = self.results.keep(request, task_id, message, away_until)
        self.stored_result_of = task_id if kept else None

    def _withdrawn_or_ended(self, task_id: str) -> bool:
        """Whether the driver withdrew the task, or it has a result already (a redelivery of
        a trial that ended), asked in one round trip: a result this worker cannot verify with
        its secret is someone else's, and the trial runs."""
        pipe = self.redis().pipeline(transaction=False)
        pipe.exists(withdrawn_key(task_id))
        pipe.get(result_key(task_id))
        withdrawn, stored = pipe.execute()
        self.withdrawn_of = task_id if withdrawn else None
        if withdrawn or stored is None:
            return bool(withdrawn)
        refusal = stored_result_refusal(self.settings.seal, task_id, stored)
        if refusal is None:
            return True
        logger.warning(
            "a result stored for task %s set aside, the trial runs: %s", task_id, refusal
        )
        return False

    def _take_slot(self) -> GpuShare | None:
        """Wait for a trial slot; put its GPUs and budget into this process's environment
        (the one place it is set), before anything the trial imports reads
        `CUDA_VISIBLE_DEVICES`: the device read below, the framework, the trial's children."""
        slot = claim_for_trial(self.slots) if self.slots is not None else None
        share = slot.gpu if slot is not None else None
        if share is not None:
            os.environ.update(share.environment())
        return share

    def _run(
        self,
        request: TrialRequest,
        channel: ReportChannel,
        root: Path | str,
        share: GpuShare | None,
        timeout_errors: tuple[type[BaseException], ...],
    ) -> TrialResult:
        return run_trial(
            request,
            channel=channel,
            device=TensorFlowDevice(),
            allowed_modules=self.settings.allowed_modules,
            import_paths=self.settings.import_paths,  # the worker's own, never a message's
            timeout_errors=timeout_errors,
            baseline=self.baseline,
            checkpoint_root=root,
            artifact_root=self.settings.artifact_root,
            own_process_group=True,
            gpu=share,
            output_max_bytes=self.settings.trial_output_max_bytes,
            soft_limit_s=request.timeout_s,
            code_gate=CodeGate(self.settings.seal, self.settings.accept_code),
        )


def _despite(timeout_errors: tuple[type[BaseException], ...], step: Callable[[], None]) -> None:
    """Run a step after the trial returned, again if Celery's soft time limit interrupts it
    (a request from a driver that still sets it; the trial's own is disarmed by now): the
    trial's outcome is decided, and a limit that passed while Redis was waited for changes
    nothing. Celery raises it once; the hard limit still ends the process.
    """
    for _ in range(3):
        try:
            step()
            return
        except timeout_errors:
            logger.warning("the soft time limit passed after the trial returned: its result stands")
    step()


def _stop_taking_trials() -> None:
    """Warm-shut the worker down: its device is not clean, so no trial should go to it.

    A container restart (compose's restart policy, Kubernetes) ends whatever process in it
    still holds the device, and the new worker measures a clean baseline.
    """
    logger.critical("device not back to its baseline; this worker stops taking trials")
    os.kill(os.getppid(), signal.SIGTERM)


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


def _end_given_up_attempt() -> None:
    """The driver gave up on this attempt (it re-sent it or told it lost while this process
    was cut off): end the process and everything it started, at once."""
    logger.warning("the driver gave up on this attempt: ending its process group")
    process_group.kill_own_group()
