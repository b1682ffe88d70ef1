"""trialq's errors: one hierarchy, each class says when it is raised.

The CLI maps `TrialqError.exit_code` to the process's exit status and prints the message
as one line; a traceback is only ever shown for a bug of ours.
"""

from __future__ import annotations

from typing import Any


class TrialqError(Exception):
    """Base of every error trialq raises on purpose."""

    exit_code = 1
    summary: dict[str, Any] | None = None
    """The run's summary where the error ended a run of a study (`submit-study --json`
    prints it before the error's line)."""


class UsageError(TrialqError):
    """Raised when command-line arguments are wrong or contradict each other."""

    exit_code = 2


class SpecError(UsageError):
    """Raised when a study spec is unreadable or has a wrong, missing or unknown key."""


class EntrypointError(SpecError):
    """Raised when a trial entrypoint cannot be imported, is not callable or is not allowed."""


class EntrypointRefused(TrialqError):
    """Raised in a trial process when its worker cannot run the entrypoint: not in its
    allowed modules, or not importable there. The trial ends `refused`, not failed."""


class FailingTrials(TrialqError):
    """Raised when trials keep failing the same way (`[study] max_failures_in_a_row`): the
    run stops with the rest of the budget kept, rather than burn it on the same failure."""

    exit_code = 5


class PreloadError(UsageError):
    """Raised when a module the worker should preload is unknown or fails to import."""


class WorkerNameTaken(UsageError):
    """Raised when `trialq worker --hostname` names a worker that another live process
    already beats as: a lost worker of the two would never be seen lost (its twin keeps the
    name's heartbeat fresh), so the worker refuses to start."""


class DeviceInParent(TrialqError):
    """Raised when the worker's parent initialised a device (a TensorFlow op, CUDA): trial
    processes forked from it would hang, so the worker refuses to fork them."""

    exit_code = 2


class ServiceUnreachable(TrialqError):
    """Raised when the broker or the Optuna storage does not answer."""

    exit_code = 3


class BrokerError(TrialqError):
    """Raised when the broker (Redis) fails a request of the dispatcher or of the report
    channel: unreachable (`BrokerUnreachable`), or refusing it."""


class BrokerUnreachable(ServiceUnreachable, BrokerError):
    """Raised when Redis (the broker or result backend) does not answer."""


class StorageUnreachable(ServiceUnreachable):
    """Raised when the Optuna storage cannot be opened."""


class ForeignWriter(TrialqError):
    """Raised when something besides this driver writes trials of its study (a second
    submit-study on the same study): the driver's copy of the study would be wrong."""

    exit_code = 2

    @classmethod
    def numbering(cls, held: int, expected: int) -> ForeignWriter:
        """The database holds `held` trials where this driver numbered its next `expected`."""
        return cls(
            f"another process is writing trials of this study (the database holds {held} "
            f"trials, this driver numbered its next trial {expected}); "
            "run one submit-study per study"
        )


class StudyInUse(TrialqError):
    """Raised when another `submit-study` drives the study already: two drivers would number
    and tell its trials twice."""

    exit_code = 2

    @classmethod
    def held_by(cls, study: str, holder: str) -> StudyInUse:
        """The study's lock is held by `holder` (a driver's name, where the database knows)."""
        return cls(
            f"study {study!r} has a driver already ({holder}); run one submit-study per "
            "study, or wait for that one to end"
        )


class StudyDeleted(TrialqError):
    """Raised when the study was deleted from its storage (`optuna.delete_study`, the
    dashboard) while its driver ran: nothing more can be written to it."""

    exit_code = 2

    @classmethod
    def named(cls, study: str) -> StudyDeleted:
        """The one line for study `study`."""
        return cls(
            f"study {study!r} deleted while it ran: its queued trials were withdrawn and "
            "nothing more is written to it"
        )


class StorageDeleted(StudyDeleted):
    """Raised when the study's SQLite file was deleted while its driver ran: SQLite refuses
    the writes ("readonly database"), which would read as an outage and be waited on, for a
    file that never comes back."""

    @classmethod
    def file(cls, path: str) -> StorageDeleted:
        """The one line for the database file at `path`."""
        return cls(
            f"the study's database {path} was deleted or moved while the driver ran: its "
            "queued trials were withdrawn and nothing more is written to it"
        )


class LocalClusterError(TrialqError):
    """Raised when `--local` cannot start its embedded Redis or its workers."""

    exit_code = 3


class Interrupted(TrialqError):
    """Raised when the user interrupts a run (Ctrl-C, SIGTERM to the driver)."""

    exit_code = 130


class TrialPruned(Exception):
    """Raised by a trial's own code when `trial.should_prune()` said so."""
