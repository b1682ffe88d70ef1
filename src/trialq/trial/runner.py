"""The per-trial runner: one attempt of one trial, inside the process that will exit after it.

It knows nothing of Celery: the task hands it a request and gets a result back, whatever
happened in between. Every failure of the trial becomes an outcome here.
"""

from __future__ import annotations

import inspect
import logging
import os
import resource
import sys
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from trialq import logs
from trialq.errors import EntrypointError, EntrypointRefused, TrialPruned
from trialq.gpu.device import Device
from trialq.gpu.share import GpuShare
from trialq.gpu.telemetry import DeviceBaseline, Sampler
from trialq.trial import checkpoints, output_cap, process_group
from trialq.trial.artifacts import Saver, artifact_saver
from trialq.trial.context import Reports, TrialContext
from trialq.trial.driver_questions import AttemptLost, DriverQuestions
from trialq.trial.frameworks.session import FrameworkRecord, FrameworkSession
from trialq.trial.memory_guard import MemoryGuard
from trialq.trial.metric_value import NotOneNumber, describe, one_number
from trialq.trial.mlflow_run import mlflow_run_id
from trialq.trial.report_sender import ReportSender
from trialq.trial.soft_limit import SoftLimitPassed, soft_limit
from trialq.wire import carried_code, failures
from trialq.wire.channel import ReportChannel, TrialAddress
from trialq.wire.entrypoint import Entrypoint, importable_from
from trialq.wire.messages import Measurements, Outcome, TrialRequest, TrialResult
from trialq.wire.signing import Seal

_log = logging.getLogger("trialq.runner")  # the name log lines show; kept when the module moved


@dataclass(frozen=True)
class Importable:
    """Where this worker lets an entrypoint come from: the modules it allows
    (`TRIALQ_ALLOWED_MODULES`) and the folders it imports them from (`TRIALQ_IMPORT_PATHS`),
    the worker's own settings, never a message's."""

    allowed_modules: tuple[str, ...]
    import_paths: tuple[str, ...] = ()
    code_gate: CodeGate | None = None
    """Where a function carried as code may run (None: nowhere)."""


@dataclass(frozen=True)
class CodeGate:
    """Whether this worker runs a trial function carried as code, and the secret its
    signature is checked with (`trialq.wire.carried_code`): the worker's settings, never a
    message's."""

    seal: Seal | None = None
    accepts: bool = False


def run_trial(
    request: TrialRequest,
    *,
    channel: ReportChannel | None,
    device: Device,
    allowed_modules: tuple[str, ...],
    import_paths: tuple[str, ...] = (),
    timeout_errors: tuple[type[BaseException], ...] = (),
    baseline: DeviceBaseline | None = None,
    checkpoint_root: Path | str | None = None,
    artifact_root: Path | str | None = None,
    own_process_group: bool = False,
    gpu: GpuShare | None = None,
    output_max_bytes: int = 0,
    soft_limit_s: float | None = None,
    code_gate: CodeGate = CodeGate(),
) -> TrialResult:
    """Run the request's entrypoint once and describe how it ended, in the trial's logs too.

    With a `baseline`, a device still holding memory an earlier trial left behind is
    refused: the trial ends as `error` without running, rather than run out of memory on it.
    With a `checkpoint_root`, the trial's `checkpoint_dir` is the request's folder under it
    (`trialq.trial.checkpoints`): a mounted folder, or a local one synced with a store. It is
    kept for the next attempt, or removed once the outcome is final (`_settle_checkpoint`).
    With `own_process_group` (a worker's trial process, never a test's own), the process
    leads a process group of its own, and every other process in it is ended when the
    trial has (`trialq.trial.process_group`).
    With `gpu` (a worker's slot, already in this process's environment: the slot's taker put
    it there before anything imports CUDA), the trial runs on that share; without, the
    environment's is read (`GpuShare.from_environment`). Either goes to the framework's adapter
    (`trialq.trial.frameworks`): its settings before the import, its cap before the first op.
    With `output_max_bytes`, the trial prints that much at most (`trialq.trial.output_cap`).
    With `soft_limit_s` (a worker's trial process), the trial's code gets that long before
    `SoftLimitPassed` ends it as `timeout` (`trialq.trial.soft_limit`).
    """
    setup = _Setup(
        channel, device, Importable(allowed_modules, import_paths, code_gate), timeout_errors,
        _gpu_share(gpu), soft_limit_s,
    )  # fmt: skip
    group = process_group.own_group() if own_process_group else nullcontext()
    capped = output_cap.capped_output(output_max_bytes)
    with logs.trial_context(request), group, capped:
        _log.info("trial started entrypoint=%s", request.entrypoint)
        refusal = baseline.refusal(device) if baseline is not None else None
        if refusal is None:
            result = _in_folders(request, setup, checkpoint_root, artifact_root)
        else:
            result = TrialResult.device_refused_here(request, refusal)
        _log_finished(result)
        return result


@dataclass(frozen=True)
class _Setup:
    """What an attempt runs with besides its request and folders: the worker's, never the
    message's."""

    channel: ReportChannel | None
    device: Device
    importable: Importable
    timeout_errors: tuple[type[BaseException], ...]
    share: GpuShare | None
    soft_limit_s: float | None


def _in_folders(
    request: TrialRequest,
    setup: _Setup,
    checkpoint_root: Path | str | None,
    artifact_root: Path | str | None,
) -> TrialResult:
    """The attempt with its checkpoint folder attached (settled after it) and its artifact
    saver, where the worker has roots for them."""
    saver = artifact_saver(artifact_root) if artifact_root is not None else None
    folder = _checkpoint_folder(request, checkpoint_root)
    with folder.attach() if folder is not None else nullcontext(None) as ckpt:
        used = folder if ckpt is not None else None  # None: the trial runs without
        save = _save_quietly(used) if used is not None else None
        result = _attempt(request, setup, ckpt, saver, save)
        if used is not None:
            result = _settle_checkpoint(request, result, used)
    return result


def _attempt(
    request: TrialRequest,
    setup: _Setup,
    checkpoint_dir: Path | None = None,
    artifact_saver: Saver | None = None,
    checkpoint_sync: Callable[[], None] | None = None,
) -> TrialResult:
    address = TrialAddress.of(request)
    reports = _reports(setup.channel)
    context = _context(request, setup, reports, checkpoint_dir, artifact_saver, checkpoint_sync)
    started = time.monotonic()
    framework = FrameworkSession(request.framework, setup.share)
    try:
        with Sampler(setup.device) as sampler, _memory_cap(request, address, setup.channel):
            ended = _outcome(request, context, setup, framework)
    finally:
        _flush(reports, setup.timeout_errors)
    duration_s = round(time.monotonic() - started, 6)
    dropped = (
        reports.dropped if isinstance(reports, ReportSender) else 0
    ) + context.reports_refused
    return _result(request, ended, duration_s, sampler, framework.record(), context, setup, dropped)


def _context(
    request: TrialRequest,
    setup: _Setup,
    reports: Reports | None,
    checkpoint_dir: Path | None,
    artifact_saver: Saver | None,
    checkpoint_sync: Callable[[], None] | None,
) -> TrialContext:
    """The `trial` argument the entrypoint gets."""
    address = TrialAddress.of(request)
    mlflow = request.mlflow
    find_run = (
        partial(mlflow_run_id, mlflow, request.study, request.number, setup.timeout_errors)
        if mlflow
        else None
    )
    questions = (
        DriverQuestions(setup.channel.questions(request.answers_signed), address)
        if request.answers and isinstance(setup.channel, ReportChannel)
        else None
    )
    return TrialContext(
        address, request.params, reports, checkpoint_dir, artifact_saver, checkpoint_sync,
        find_run, questions, request.distributions,
    )  # fmt: skip


def _result(
    request: TrialRequest,
    ended: tuple[Outcome, dict[str, float], str | None],
    duration_s: float,
    sampler: Sampler,
    record: FrameworkRecord,
    context: TrialContext,
    setup: _Setup,
    reports_dropped: int,
) -> TrialResult:
    """How the attempt ended, with what it measured."""
    outcome, metrics, error = ended
    gpu = sampler.result()
    host = Measurements(
        duration_s=duration_s, peak_rss_bytes=_peak_rss_bytes(), reports_dropped=reports_dropped
    )
    nvml = Measurements(
        gpu_memory_used_peak_bytes=gpu.memory_used_peak_bytes,
        gpu_utilization_mean=gpu.utilization_mean,
    )
    asked = Measurements(fitted_batch_size=context.fitted_batch_size)
    return TrialResult.here(
        request, outcome, error, host, _framework_measurements(record, setup.device), nvml, asked,
        metrics=metrics, last_step=context.last_step, artifacts=tuple(context.artifacts),
        user_attrs=context.user_attrs,
    )  # fmt: skip


def _framework_measurements(record: FrameworkRecord, device: Device) -> Measurements:
    """What the trial's framework recorded of itself and its GPUs."""
    return Measurements(
        framework=record.framework, gpu_peak_bytes=_largest_peak(record, device),
        gpu_peaks_bytes=record.peaks, gpu_budget_bytes=record.budget_bytes,
        gpu_cap_applied=record.cap_applied, gpu_cap_note=record.cap_note,
        gpu_model=record.model, gpu_context_bytes=record.context_bytes,
    )  # fmt: skip


def _outcome(
    request: TrialRequest, context: TrialContext, setup: _Setup, framework: FrameworkSession
) -> tuple[Outcome, dict[str, float], str | None]:
    """Every way the entrypoint can end, as (outcome, metrics, error)."""
    timeout_errors: tuple[type[BaseException], ...] = (*setup.timeout_errors, SoftLimitPassed)
    try:
        with process_group.forks_exit_here(), soft_limit(setup.soft_limit_s):
            metrics = _call_entrypoint(request, context, setup.device, setup.importable, framework)
    except TrialPruned:
        return Outcome.PRUNED, {}, None
    except AttemptLost as exc:  # its driver cannot answer it: re-sent as a lost one is
        return Outcome.WORKER_LOST, {}, f"the driver did not answer: {exc}"
    except timeout_errors:
        return Outcome.TIMEOUT, {}, f"soft time limit of {request.timeout_s:g} s exceeded"
    except EntrypointRefused as exc:  # this worker cannot run it: not the trial's failure
        return Outcome.REFUSED, {}, str(exc)
    except NoMetrics as exc:  # a TypeError of the trial's, as it always read
        return Outcome.ERROR, {}, f"TypeError: {exc}"
    except Exception as exc:
        if failures.optuna_pruned(exc):
            return Outcome.PRUNED, {}, None
        return failures.classify(exc), {}, failures.describe(exc)
    if context.stop_seen:
        # It saw should_stop() say yes, then returned: cut short, not a final value.
        return Outcome.PREEMPTED, metrics, "stopped early: should_stop() said yes"
    return Outcome.OK, metrics, None


def _reports(channel: ReportChannel | None) -> Reports | None:
    """Redis's channel behind a sender thread, so no report or flag waits on Redis; a
    test's stand-in channel as it is."""
    return ReportSender(channel) if isinstance(channel, ReportChannel) else channel


def _flush(reports: Reports | None, timeout_errors: tuple[type[BaseException], ...]) -> None:
    """Every report on Redis before the result (bounded: `report_sender.FLUSH_LIMIT_S`);
    the soft time limit, arriving meanwhile, ends the wait, not the trial."""
    if isinstance(reports, ReportSender):
        try:
            reports.close()
        except timeout_errors:
            _log.warning("reports not all sent: the soft time limit came first")


def _checkpoint_folder(
    request: TrialRequest, root: Path | str | None
) -> checkpoints.CheckpointFolder | None:
    if root is None or request.checkpoint_key is None:
        return None
    return checkpoints.for_trial(root, request.checkpoint_key)


def _save_quietly(folder: checkpoints.CheckpointFolder) -> Callable[[], None]:
    """The save `should_stop()` runs on a yes: a failure is logged, never the trial's."""

    def save() -> None:
        try:
            folder.save()
        except Exception as exc:  # any store's error: fsspec backends raise their own
            _log.warning("checkpoint folder not uploaded: %s", exc)

    return save


def _settle_checkpoint(
    request: TrialRequest, result: TrialResult, folder: checkpoints.CheckpointFolder
) -> TrialResult:
    """At the attempt's end: remove the trial's folder when no attempt will come after this
    one; else (preempted, or kept) save it for the next.

    `preempted` is re-sent; any other outcome the trial process reports is final (the driver
    retries only a lost process or a refused device, and this one was neither).
    """
    final = not result.outcome.resumes and not request.keep_checkpoints
    try:
        if not final:
            folder.save()
            return result
        removed = folder.remove()
    except Exception as exc:  # an OSError on a mount, any store's error on a URL
        _log.warning("checkpoint folder not %s: %s", "removed" if final else "saved", exc)
        return result
    return result.with_checkpoint_removed(removed)


def _gpu_share(gpu: GpuShare | None) -> GpuShare | None:
    """The trial's GPUs: the worker's share, else what the environment carries."""
    return gpu if gpu is not None else GpuShare.from_environment(os.environ)


def _largest_peak(record: FrameworkRecord, device: Device) -> int | None:
    """`gpu_peak_bytes`: the largest of the framework's peaks, else the device's own reading."""
    return record.largest_peak if record.peaks else device.peak_bytes()


def _log_finished(result: TrialResult) -> None:
    """INFO for a trial that ended as trials do (ok, pruned), WARNING with the error else."""
    duration_s = result.duration_s or 0.0  # none where the trial never ran
    if result.outcome.succeeded:
        _log.info("trial finished outcome=%s duration_s=%.3f", result.outcome, duration_s)
        return
    _log.warning(
        "trial finished outcome=%s duration_s=%.3f error=%s",
        result.outcome, duration_s, failures.headline(result.error) or "",
    )  # fmt: skip


def _call_entrypoint(
    request: TrialRequest,
    context: TrialContext,
    device: Device,
    importable: Importable,
    framework: FrameworkSession,
) -> dict[str, float]:
    """Allowed, then: the framework's environment, the import, its cap, the call."""
    entrypoint = request.entrypoint
    if request.code is not None:
        gate = importable.code_gate or CodeGate()
        device.prepare()
        train = carried_code.loaded(request.code, request.code_signature, gate.seal, gate.accepts)
        return numeric_metrics(call_train(train, request.params, context,
                                          suggests=request.suggests))  # fmt: skip
    allowed_modules = importable.allowed_modules
    if not entrypoint.is_allowed(allowed_modules):
        raise EntrypointRefused(
            f"entrypoint {entrypoint} is not in this worker's allowed modules "
            f"({', '.join(allowed_modules) or 'none'}); set TRIALQ_ALLOWED_MODULES"
        )
    device.prepare()
    with importable_from(*(Path(p) for p in importable.import_paths)):
        framework.before_import(entrypoint.source(Path.cwd()), entrypoint.function)
        before = set(sys.modules)
        train = _load(entrypoint)
    framework.after_import(before)
    returned = call_train(train, request.params, context, suggests=request.suggests)
    return numeric_metrics(returned)


def _load(entrypoint: Entrypoint) -> Callable[..., Any]:
    """The entrypoint's function; one that does not import on this worker (a module or a
    dependency missing, a file with a syntax error, no such function) is refused. Anything
    else raised while importing it (the soft time limit, a bug of the user's module) is the
    trial's own end, as if raised by the trial."""
    try:
        return entrypoint.load()
    except (ImportError, SyntaxError, EntrypointError) as exc:
        reason = failures.headline(failures.describe(exc))
        raise EntrypointRefused(f"{entrypoint} does not import on this worker: {reason}") from exc


def _memory_cap(
    request: TrialRequest, address: TrialAddress, channel: ReportChannel | None
) -> AbstractContextManager[object]:
    """A `MemoryGuard` when the spec sets `memory_limit_mb`, else nothing."""
    if request.memory_limit_mb <= 0:
        return nullcontext()

    def leave_word(rss: int) -> None:
        if channel is not None:
            channel.mark_memory_exceeded(address, rss)

    return MemoryGuard(request.memory_limit_mb * 1024 * 1024, leave_word)


def call_train(
    train: Callable[..., Any],
    params: dict[str, Any],
    context: TrialContext,
    *,
    suggests: bool = False,
) -> Any:
    """`train(trial)` for an Optuna objective (`suggests`: it draws its own params);
    else `train(params, trial)`, or `train(params)` for a function of one argument."""
    if suggests:
        return _call_objective(train, context)
    try:
        takes_context = len(inspect.signature(train).parameters) >= 2
    except (TypeError, ValueError):
        takes_context = True
    return train(params, context) if takes_context else train(params)


class NoMetrics(TypeError):
    """Raised when what the trial returned holds no metric trialq can record: the trial's
    mistake, said in one line (its error has no traceback: the frames would be trialq's)."""


def _call_objective(train: Callable[..., Any], context: TrialContext) -> Any:
    """`train(trial)`; a function that wants `(params, trial)` in a study that declares no
    space is said in one line, not met as a TypeError deep inside it."""
    try:
        arity = len(inspect.signature(train).parameters)
    except (TypeError, ValueError):
        arity = 1
    if arity >= 2:
        raise TypeError(
            f"{getattr(train, '__qualname__', train)} takes (params, trial), but the study "
            "declares no space ([space.*] or search_space): a function that draws its own "
            "params takes the trial alone and calls trial.suggest_*"
        )
    return train(context)


def numeric_metrics(returned: object) -> dict[str, float]:
    """A returned number becomes `{"value": x}`; a mapping keeps its numeric entries. A 0-d
    tensor or NumPy scalar is a number (`metric_value.one_number`); an array or tensor of
    more than one number, or an int no float holds, is refused, naming its key."""
    if isinstance(returned, bool):
        raise NoMetrics("the trial returned a bool; return a number or a mapping of metrics")
    if isinstance(returned, Mapping):
        metrics = _mapped_metrics(returned)
        if metrics:
            return metrics  # NaN and inf kept as such: the driver judges an objective
        raise NoMetrics(
            f"the trial returned a mapping with no number in it ({_kinds(returned)}); "
            "return a mapping of metric names to numbers"
        )
    try:
        number = one_number(returned)
    except NotOneNumber as exc:
        raise NoMetrics(f"the trial returned {exc}") from None
    if number is not None:
        return {"value": number}
    raise NoMetrics(
        f"the trial returned {describe(returned)}; "
        "return a number or a mapping of metric names to numbers"
    )


def _kinds(returned: Mapping[Any, Any], shown: int = 5) -> str:
    """`score: str, epoch: NoneType`: what each entry of a mapping was, the first few."""
    kinds = [f"{name}: {describe(value)}" for name, value in list(returned.items())[:shown]]
    return ", ".join(kinds) + (", ..." if len(returned) > shown else "") or "empty"


def _mapped_metrics(returned: Mapping[Any, Any]) -> dict[str, float]:
    """The entries that are one number; text and other non-numbers are left out as before."""
    metrics: dict[str, float] = {}
    for name, value in returned.items():
        try:
            number = one_number(value)
        except NotOneNumber as exc:
            raise NoMetrics(f"metric {name}: {exc}") from None
        if number is not None:
            metrics[str(name)] = number
    return metrics


def _peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux reports kilobytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
