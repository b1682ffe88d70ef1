"""Outages of the services the driver needs (Redis, the Optuna storage), ridden out for a
bounded time.

The driver's loop runs its passes inside `Outages.tolerated()`. A lost connection, a
restarting server or a failover is logged in one line, and the pass is retried with backoff
while the trials in flight keep running on their workers; what could not be written stays
pending in the driver's copy (`trialq.driver._storage.mirror`) and goes in with the next
commit. When the service answers again the run goes on as if nothing happened. An outage
longer than the limit ends the run with one line and exit 3 (`ServiceUnreachable`); a re-run
resumes the study.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator

import optuna
import sqlalchemy

from trialq.errors import BrokerUnreachable, ServiceUnreachable, StorageUnreachable

_log = logging.getLogger("trialq.outage")  # the name log lines show; kept when the module moved

FIRST_RETRY_S = 0.5
LONGEST_RETRY_S = 5.0
"""Backoff between retries: doubling from the first to the longest."""
SETTLED_S = 10.0
"""How long a service must have answered before it is said back. A Redis full or refusing
writes still answers reads, so passes that only read went through between those that write:
an 8 s outage was said "unreachable" and "back" five times each."""

_STORAGE_OUTAGES = (
    sqlalchemy.exc.OperationalError,  # connection refused or lost, server shutting down
    sqlalchemy.exc.InterfaceError,  # a connection already closed under the driver
    sqlalchemy.exc.TimeoutError,  # no connection from the pool in time
    sqlalchemy.exc.DisconnectionError,
    StorageUnreachable,
)


def service_lost(exc: BaseException) -> str | None:
    """`"broker"` or `"storage"` where `exc` (or an error it wraps: Optuna's
    `StorageInternalError` wraps SQLAlchemy's) says the service is away; None for any other
    error, which is no outage and must not be retried. The broker is reached only through
    the dispatcher, which says an outage as `BrokerUnreachable` (`trialq.wire.dispatch`):
    Redis's own errors never reach here."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, BrokerUnreachable):
            return "broker"
        if isinstance(seen, _STORAGE_OUTAGES):
            return "storage"
        if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.connection_invalidated:
            return "storage"
        if not isinstance(
            seen, optuna.exceptions.StorageInternalError | sqlalchemy.exc.SQLAlchemyError
        ):
            return None
        seen = seen.__cause__ or seen.__context__
    return None


class Outages:
    """Rides out lost services: retries the loop's pass until they answer or a limit passes."""

    def __init__(
        self,
        limit_s: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._limit_s = limit_s
        self._clock = clock
        self._sleep = sleep
        self._since: dict[str, float] = {}  # service -> when its outage began
        self._said: dict[str, float] = {}  # service said unreachable -> when, not yet back
        self._back: dict[str, float] = {}  # service answering again -> since when
        self._retry_s = FIRST_RETRY_S

    def away(self, service: str) -> bool:
        """Whether `service` ("broker" or "storage") is known to be away right now."""
        return service in self._since

    @contextlib.contextmanager
    def tolerated(self) -> Iterator[None]:
        """Swallow a lost service's error (the caller retries the pass) until the outage is
        longer than the limit; any other error goes through."""
        try:
            yield
        except Exception as exc:
            service = service_lost(exc)
            if service is None:
                raise
            self._wait(service, exc)
        else:
            # Every pass that has work asks Redis; the storage may go unasked for a while, so
            # it is back only when it answers (`recovered`).
            self.recovered("broker")
            self.settled(SETTLED_S)

    def _wait(self, service: str, exc: BaseException) -> None:
        now = self._clock()
        since = self._since.setdefault(service, now)
        reason = _first_line(_what_happened(exc))
        self._back.pop(service, None)  # not back after all: the same outage goes on
        if service not in self._said:
            self._said[service] = now
            _log.warning(
                "%s unreachable (%s); the trials in flight keep running, retrying for up to %g s",
                service, reason, self._limit_s,
            )  # fmt: skip
        if now - since > self._limit_s:
            error = BrokerUnreachable if service == "broker" else StorageUnreachable
            raise error(f"{service} unreachable for {self._limit_s:g} s: {reason}") from None
        self._sleep(self._retry_s)
        self._retry_s = min(self._retry_s * 2, LONGEST_RETRY_S)

    def recovered(self, service: str) -> None:
        """`service` answered: its outage, if any, is over (said once it has answered for
        `SETTLED_S`, or at the run's end: `settled`)."""
        if self._since.pop(service, None) is not None:
            self._back.setdefault(service, self._clock())
        if not self._since:
            self._retry_s = FIRST_RETRY_S

    def settled(self, for_s: float = 0.0) -> None:
        """Say "back" of each service that has answered for `for_s` since its outage (0: of
        every service answering again, as the run ends)."""
        now = self._clock()
        for service, back in list(self._back.items()):
            if now - back >= for_s:
                began = self._said.pop(service, back)
                del self._back[service]
                _log.warning("%s back after %.1f s", service, back - began)


def _what_happened(exc: BaseException) -> BaseException:
    """The error the dispatcher's `BrokerUnreachable` wraps (a lost connection, a timeout)
    says what happened; its own text only names the service again."""
    cause = exc.__cause__
    return cause if isinstance(exc, BrokerUnreachable) and cause is not None else exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


__all__ = ["Outages", "ServiceUnreachable", "service_lost"]
