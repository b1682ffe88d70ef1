"""The command line: `submit-study` and `trialq worker | status | report | health`.

Errors of the user's making become one line on stderr and an exit code (docs/design.md):
0 done with a complete trial, 1 done with none, 2 bad spec or arguments, 3 broker or
storage unreachable, 4 a bug of trialq's (with its traceback), 130 interrupted. A crash is
never 1, which scripts read as "done, nothing complete". Heavy imports wait until a command
needs them.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from trialq.driver import interrupts
from trialq.errors import Interrupted, ServiceUnreachable, TrialqError, UsageError
from trialq.limits import INT32_MAX, SECONDS_MAX
from trialq.settings import Settings, redacted_url, settings_with_broker
from trialq.wire.keys import DEFAULT_QUEUE

if TYPE_CHECKING:
    from trialq.local import LocalGpus

INTERNAL_ERROR_EXIT_CODE = 4
STUDY_ARGUMENT_HELP = (
    "the study's spec file (its storage found as submit-study finds it), or a study name"
)


class _Parser(argparse.ArgumentParser):
    """argparse that raises `UsageError` instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def submit_study_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `submit-study`."""
    as_json = _asks_for_json(argv)
    return _run(lambda: _submit_study(_submit_parser().parse_args(argv)), as_json)


def trialq_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `trialq`."""
    as_json = _asks_for_json(argv)
    return _run(lambda: _dispatch_trialq(*_trialq_parser().parse_known_args(argv)), as_json)


def _asks_for_json(argv: Sequence[str] | None) -> bool:
    """Whether the command line holds `--json`, read before parsing: a command line argparse
    refuses still answers in JSON."""
    return "--json" in (sys.argv[1:] if argv is None else argv)


def _run(command: Callable[[], int], as_json: bool = False) -> int:
    """Run a command, turning trialq's errors into one line and an exit code; under `--json`,
    an exit with no summary printed prints one JSON object too (`exit_code`, `error`)."""
    code, message, summary = _exit_of(command)
    if message is not None:
        print(message, file=sys.stderr)
        if as_json:
            _show_json({**(summary or {}), "exit_code": code, "error": message})
    return code


def _exit_of(command: Callable[[], int]) -> tuple[int, str | None, dict[str, Any] | None]:
    """The command's exit code, its error line (None when it ended on its own) and the
    summary of a run the error ended."""
    interrupts.install()
    try:
        return command(), None, None
    except TrialqError as exc:
        return exc.exit_code, f"error: {exc}", exc.summary
    except KeyboardInterrupt:
        return Interrupted.exit_code, "interrupted", None
    except Exception as exc:
        from pydantic import ValidationError

        from trialq.driver.outage import service_lost

        if isinstance(exc, ValidationError) and exc.title == "Settings":  # a TRIALQ_* variable
            error = exc.errors()[0]
            where = ".".join(str(part) for part in error["loc"]) or "settings"
            message = error["msg"].removeprefix("Value error, ")
            return UsageError.exit_code, f"error: environment: {where}: {message}", None
        service = service_lost(exc)
        if service is not None:  # lost where no outage is ridden out (before the loop)
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return ServiceUnreachable.exit_code, f"error: {service} unreachable: {reason}", None
        traceback.print_exc()
        internal = f"error: internal error (a bug of trialq's; the traceback is above): {exc!r}"
        return INTERNAL_ERROR_EXIT_CODE, internal, None


# --- submit-study -------------------------------------------------------------------------


def _submit_parser() -> _Parser:
    parser = _Parser(prog="submit-study", description="Run an Optuna study as a queue of trials.")
    _add_version(parser)
    parser.add_argument("spec", type=Path, help="the study spec (TOML, or YAML with the same keys)")
    parser.add_argument("--local", action="store_true", help="start Redis and workers here")
    parser.add_argument("--workers", type=_positive_int, help="local workers (with --local)")
    parser.add_argument("--broker", help="broker URL (default: TRIALQ_BROKER_URL)")
    parser.add_argument("--storage", help="Optuna storage URL (overrides the spec)")
    parser.add_argument("--n-trials", type=_positive_int, help="finished trials to reach")
    parser.add_argument(
        "--outage-limit",
        type=_positive_float,
        metavar="SECONDS",
        help="how long to wait for a lost broker or storage before giving up "
        "(default: the spec's study.outage_limit_s, else 300)",
    )
    _add_budget_flags(parser)
    _add_local_gpu_flags(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="log sent/told/retried trials on stderr (and --local workers at DEBUG)",
    )
    return parser


def _add_budget_flags(parser: _Parser) -> None:
    """The spec's [study] budgets, for a one-off run (docs/spec.md, "Budgets")."""
    budgets = parser.add_argument_group("budgets (override the spec's [study] keys this run)")
    budgets.add_argument("--max-wall-s", type=_positive_float, metavar="SECONDS",
                         help="send no trial after this run's wall time")  # fmt: skip
    budgets.add_argument("--max-wall-hard", action="store_true", default=None,
                         help="at --max-wall-s, stop trials in flight for a later run")  # fmt: skip
    budgets.add_argument("--max-gpu-hours", type=_positive_float, metavar="HOURS",
                         help="the study's finished trials' duration x GPUs")  # fmt: skip
    budgets.add_argument("--goal", type=_finite_float, metavar="VALUE",
                         help="stop once the best value reaches it")  # fmt: skip
    budgets.add_argument("--max-failed-trials", type=_positive_int, metavar="N",
                         help="stop once the study has N failed trials (exit 5)")  # fmt: skip


def _add_local_gpu_flags(parser: _Parser) -> None:
    """`trialq worker`'s GPU flags, for the one worker `--local` starts to own the GPUs."""
    gpus = parser.add_argument_group("--local's GPUs (as trialq worker's flags)")
    gpus.add_argument("--gpus", metavar="all|0,1|GPU-<uuid>,...",
                      help="one local worker owns these GPUs, cut into trial slots")  # fmt: skip
    gpus.add_argument("--trials-per-gpu", type=_positive_int, metavar="N",
                      help="trials at once on each GPU (with --gpus)")  # fmt: skip
    gpus.add_argument("--gpus-per-trial", type=_positive_int, metavar="K",
                      help="GPUs each slot spans (with --gpus)")  # fmt: skip
    gpus.add_argument("--gpu-memory-mb", type=_non_negative_int, metavar="M",
                      help="GPU memory each trial may hold (with --gpus)")  # fmt: skip


_LOCAL_GPU_FLAGS = ("gpus", "trials_per_gpu", "gpus_per_trial", "gpu_memory_mb")
"""`submit-study --local`'s GPU flags (`trialq.local.LocalGpus`)."""


def _local_gpus(args: argparse.Namespace) -> LocalGpus | None:
    """The local worker's GPUs from the flags; refused (exit 2) without --local, a slot
    flag without --gpus, or --gpus with --workers (one worker owns the GPUs)."""
    given = [flag for flag in _LOCAL_GPU_FLAGS if getattr(args, flag)]
    if not given:
        return None
    named = ", ".join("--" + flag.replace("_", "-") for flag in given)
    if not args.local:
        raise UsageError(
            f"submit-study: {named} configure --local's worker; a remote worker takes "
            "them itself (trialq worker --gpus ...)"
        )
    if "gpus" not in given:
        raise UsageError(f"submit-study: {named} cut --gpus into slots; give --gpus too")
    if args.workers:
        raise UsageError(
            "submit-study: --gpus: one local worker owns the GPUs (its trials at once are its "
            "slots: --trials-per-gpu); leave out --workers"
        )
    from trialq.local import LocalGpus

    return LocalGpus(args.gpus, args.trials_per_gpu, args.gpus_per_trial, args.gpu_memory_mb)


_BUDGET_FLAGS = {
    "max_wall_s": "max_wall_s",
    "max_wall_hard": "hard_wall",
    "max_gpu_hours": "max_gpu_hours",
    "goal": "goal",
    "max_failed_trials": "max_failed_trials",
}


def _budget_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The budget flags given on the command line, as `Budget` fields."""
    given = {field: getattr(args, flag) for flag, field in _BUDGET_FLAGS.items()}
    return {field: value for field, value in given.items() if value is not None}


def _add_version(parser: _Parser) -> None:
    from trialq import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")


N = TypeVar("N", int, float)


def _positive_int(text: str) -> int:
    # a count the storage holds (trialq/limits.py)
    return _parsed(
        text, int, "a positive integer", lambda v: 0 < v <= INT32_MAX,
        f"a positive integer up to {INT32_MAX}",
    )  # fmt: skip


def _positive_float(text: str) -> float:
    # a time Python's clocks take (trialq/limits.py)
    return _parsed(
        text, float, "a positive number", lambda v: 0 < v <= SECONDS_MAX,
        f"a positive number up to {SECONDS_MAX:g}",
    )  # fmt: skip


def _finite_float(text: str) -> float:
    """A number that can be reached: never NaN (no value ever equals it) nor infinite."""
    return _parsed(text, float, "a number", math.isfinite, "a finite number")


def _parsed(
    text: str, convert: Callable[[str], N], what: str, holds: Callable[[N], bool], bound: str
) -> N:
    """`text` as `convert` reads it, refused in argparse's words as not `what`, or out of
    `bound` when it does not hold."""
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not holds(value):
        raise argparse.ArgumentTypeError(f"expected {bound}, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"expected 0 or a positive integer, got {text!r}")


def _submit_study(args: argparse.Namespace) -> int:
    if args.workers and not args.local:
        raise UsageError("submit-study: --workers needs --local")
    if args.local and args.broker:
        raise UsageError("submit-study: --broker and --local exclude each other")
    settings = settings_with_broker(args.broker)
    _log_to_stderr(args.verbose, settings)
    local_gpus = _local_gpus(args)
    try:
        summary = _submitted(args, settings, local_gpus)
    except TrialqError as exc:
        if exc.summary is not None and not args.json:  # a run stopped early says what it did
            _print_outcome(exc.summary)  # (under --json, the error's object holds it)
        raise
    code = 0 if summary["n_complete"] > 0 else 1
    if args.json:
        _show_json({**summary, "exit_code": code})
    else:
        _print_outcome(summary)
    return code


def _submitted(
    args: argparse.Namespace, settings: Settings, local_gpus: LocalGpus | None
) -> dict[str, Any]:
    from trialq import submit

    workers = 1 if local_gpus else (args.workers or 2)
    return submit.submit_study(
        spec_path=args.spec,
        settings=settings,
        storage_override=args.storage,
        n_trials=args.n_trials,
        local_workers=workers if args.local else None,
        show_progress=not args.no_progress,
        outage_limit_s=args.outage_limit,
        budget_overrides=_budget_overrides(args),
        verbose=args.verbose,
        local_gpus=local_gpus,
    )


def _show_json(summary: dict[str, Any]) -> None:
    """One JSON object on stdout, one line: what a script piping into `jq` reads."""
    json.dump(summary, sys.stdout, default=str)
    sys.stdout.write("\n")


def _log_to_stderr(verbose: bool, settings: Settings) -> None:
    """Log lines only when asked for (-v: INFO; TRIALQ_LOG_LEVEL wins): clean output else."""
    level = settings.log_level or ("INFO" if verbose else None)
    if level is not None:
        from trialq import logs

        logs.to_stderr(level)


FAILURES_SHOWN = 5
"""Failed trials listed by name at the end of a run; the rest are counted."""


def _print_outcome(summary: dict[str, Any]) -> None:
    """The counts, the best trial (values rounded), and why trials failed."""
    from trialq.views.summary import failure_lines, rounded

    best = "none complete"
    if summary["best_value"] is not None:
        best = f"best value {rounded(summary['best_value'])} with {rounded(summary['best_params'])}"
    print(
        f"study {summary['study']}: {summary['n_complete']} complete, "
        f"{summary['n_pruned']} pruned, {summary['n_failed']} failed; {best}",
        file=sys.stderr,
    )
    failures = failure_lines(summary)
    for line in failures[:FAILURES_SHOWN]:
        print(f"  {line}", file=sys.stderr)
    if len(failures) > FAILURES_SHOWN:
        print(f"  and {len(failures) - FAILURES_SHOWN} more failed", file=sys.stderr)


# --- trialq -------------------------------------------------------------------------------


def _trialq_parser() -> _Parser:
    parser = _Parser(prog="trialq", description="trialq workers, status, reports and health.")
    _add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    _add_worker_parser(commands)
    status = commands.add_parser("status", help="a study's trials and the live workers")
    status.add_argument("study", help=STUDY_ARGUMENT_HELP)
    status.add_argument(
        "--storage", help="Optuna storage URL (default: the spec's, else TRIALQ_STORAGE)"
    )
    status.add_argument("--broker", help="broker URL, for live workers")
    status.add_argument("--json", action="store_true")
    report = commands.add_parser("report", help="a study's plots and an offline HTML page")
    report.add_argument("study", help=STUDY_ARGUMENT_HELP)
    report.add_argument("--out", type=Path, required=True, help="folder for index.html, PNGs")
    report.add_argument(
        "--storage", help="Optuna storage URL (default: the spec's, else TRIALQ_STORAGE)"
    )
    _add_run_trial_parser(commands)
    health = commands.add_parser("health", help="exit 0 if a worker on this host beats")
    health.add_argument("--max-age", type=float, help="seconds since the last beat")
    health.add_argument("--broker", help="broker URL (default: TRIALQ_BROKER_URL)")
    return parser


def _add_run_trial_parser(commands: Any) -> None:
    run = commands.add_parser(
        "run-trial", help="one trial in this process (a debugger works), told to no study"
    )
    run.add_argument("spec", type=Path, help="the study spec")
    run.add_argument("--params", required=True, help="the params as a JSON object")
    run.add_argument("--tell", action="store_true", help="add the trial to the study, finished")
    run.add_argument(
        "--storage", help="Optuna storage URL for --tell (default: as submit-study finds it)"
    )


def _add_worker_parser(commands: Any) -> None:
    """`trialq worker` and its flags."""
    worker = commands.add_parser(
        "worker",
        help="run a Celery worker: one trial per process",
        description="A Celery worker that runs each trial in a fresh process. Entrypoints are "
        "imported only from TRIALQ_ALLOWED_MODULES: module prefixes (trialq.examples), or "
        "folders ending in / (a spec's file.py:function entrypoints under them).",
    )
    worker.add_argument(
        "--queue", "-Q", default=DEFAULT_QUEUE,
        help=f"the queue to take trials from: a spec's [trial] queue (default {DEFAULT_QUEUE!r})",
    )  # fmt: skip
    worker.add_argument("--gpu", help="GPU index this worker's trials see (CUDA_VISIBLE_DEVICES)")
    _add_gpu_slot_flags(worker)
    worker.add_argument("--broker", help="broker URL (default: TRIALQ_BROKER_URL)")
    worker.add_argument(
        "--concurrency", "-c", type=_positive_int, default=1,
        help="trials at once, each in its own process (default 1; with --gpus, the slots)",
    )  # fmt: skip
    worker.add_argument(
        "--hostname", "-n",
        help="Celery node name (default trialq-PID-XXXX@HOST, new at every start); refused "
        "while another live worker beats under it",
    )  # fmt: skip
    worker.add_argument(
        "--loglevel", "-l", default="INFO",
        help="DEBUG, INFO (a line as each trial starts and ends; the default), WARNING, ERROR",
    )  # fmt: skip
    worker.add_argument(
        "--preload",
        help="modules the worker imports once, before forking trials: auto (the framework "
        "installed; of several, PyTorch and JAX, never TensorFlow beside another), none, or "
        "comma-separated names (default: TRIALQ_PRELOAD, else auto)",
    )
    worker.add_argument(
        "--preload-from", metavar="MODULE|FILE",
        help="also preload what this entrypoint module imports at its top (scikit-learn, "
        "pandas...), read without importing it (default: TRIALQ_PRELOAD_FROM)",
    )  # fmt: skip
    worker.add_argument(
        "--spare",
        type=_non_negative_int,
        help="idle processes kept forked beyond the trial slots (default: "
        "TRIALQ_SPARE_PROCESSES, else 1)",
    )


def _add_gpu_slot_flags(worker: argparse.ArgumentParser) -> None:
    """`--gpus` and how the worker cuts them into trial slots (docs/design.md, "Workers")."""
    worker.add_argument(
        "--gpus",
        help="the GPUs this worker owns: all, indices (0,1) or GPU-<uuid>/MIG-<uuid> names; "
        "its concurrency is then its slots (default: TRIALQ_GPUS)",
    )
    worker.add_argument("--trials-per-gpu", type=_positive_int,
                        help="trials run at once on each GPU (with --gpus; default 1)")  # fmt: skip
    worker.add_argument(
        "--gpus-per-trial",
        type=_positive_int,
        help="GPUs each trial gets, with --gpus ([trial] gpus it takes; default 1)",
    )
    worker.add_argument(
        "--gpu-memory-mb",
        type=_positive_int,
        help="each trial's memory budget on each GPU, with --gpus (default: the card less a "
        "CUDA context per trial, shared evenly)",
    )


_GPU_SLOT_FLAGS = ("trials_per_gpu", "gpus_per_trial", "gpu_memory_mb")
"""The flags that mean something only with `--gpus`."""

_WORKER_FLAGS = {
    "gpus": "gpus",
    "trials_per_gpu": "trials_per_gpu",
    "gpus_per_trial": "gpus_per_trial",
    "gpu_memory_mb": "gpu_memory_mb",
    "broker": "broker_url",
    "gpu": "cuda_visible_devices",
    "preload": "preload",
    "preload_from": "preload_from",
    "spare": "spare_processes",
}
"""`trialq worker`'s flags and the settings each one gives."""


def _worker_settings(args: argparse.Namespace) -> Settings:
    """The environment's settings, with the flags given on top (checked as the environment's
    are): what the worker is built from."""
    given = {field: getattr(args, flag) for flag, field in _WORKER_FLAGS.items()}
    settings = Settings(**{field: value for field, value in given.items() if value is not None})
    if args.gpu is not None and settings.gpus:
        raise UsageError("trialq worker: --gpu (one GPU, one trial) and --gpus exclude each other")
    slot_flags = _gpu_slot_flags_given(args)
    if slot_flags and not settings.gpus:  # once accepted and ignored
        raise UsageError(
            f"trialq worker: {', '.join(slot_flags)} cut --gpus into slots; "
            "give --gpus (or TRIALQ_GPUS) too"
        )
    return settings


def _gpu_slot_flags_given(args: argparse.Namespace) -> list[str]:
    """The flags of `_GPU_SLOT_FLAGS` given, as the command line spells them."""
    return [f"--{name.replace('_', '-')}" for name in _GPU_SLOT_FLAGS if getattr(args, name)]


def _dispatch_trialq(args: argparse.Namespace, rest: list[str]) -> int:
    if args.command != "worker" and rest:
        raise UsageError(f"trialq {args.command}: unrecognized arguments: {' '.join(rest)}")
    if args.command == "worker":
        return _worker(args, rest)
    if args.command == "health":
        return _health(args)
    if args.command == "report":
        return _report(args)
    if args.command == "run-trial":
        from trialq.run_trial import run_here

        return run_here(args.spec, args.params, args.tell, args.storage)
    return _status(args)


def _worker(args: argparse.Namespace, rest: list[str]) -> int:
    """Start the Celery worker in this process, with the design's settings pinned."""
    settings = _worker_settings(args)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # Celery's own warm shutdown
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    from trialq._celery.launch import WorkerOptions, run_worker

    options = WorkerOptions(args.queue, args.concurrency, args.hostname, args.loglevel, rest)
    return run_worker(settings, options)


def _health(args: argparse.Namespace) -> int:
    import redis

    from trialq.wire.heartbeat import local_worker_alive

    broker = settings_with_broker(args.broker).broker_url
    client = redis.Redis.from_url(broker, socket_timeout=5)
    asked = f"asked {redacted_url(broker)}"
    try:
        alive = local_worker_alive(client, args.max_age)
    except redis.RedisError as exc:
        print(f"unhealthy: broker unreachable ({asked}): {type(exc).__name__}", file=sys.stderr)
        return 1
    verdict = "healthy" if alive else "unhealthy: no worker heartbeat on this host"
    print(f"{verdict} ({asked})", file=sys.stderr)
    return 0 if alive else 1


def _status(args: argparse.Namespace) -> int:
    from trialq.driver.study import find_study
    from trialq.views.status import LOCAL_BROKER, show_status
    from trialq.wire.messages import BROKER_ATTR

    settings = settings_with_broker(args.broker)
    study = find_study(args.study, args.storage, settings.storage, "trialq status")
    ran_local = study.user_attrs.get(BROKER_ATTR) == LOCAL_BROKER and not args.broker
    broker = None if ran_local else settings.broker_url
    return show_status(study, broker, as_json=args.json)


def _report(args: argparse.Namespace) -> int:
    """Write the study's report and print where its page is."""
    from trialq.driver.study import find_study
    from trialq.views.report import write_report

    study = find_study(args.study, args.storage, Settings().storage, "trialq report")
    print(write_report(study, args.out))
    return 0


__all__ = ["submit_study_main", "trialq_main"]
