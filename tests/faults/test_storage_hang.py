"""A database that stops answering without a word (issue 26, item 5).

A frozen PostgreSQL, or a partition that drops packets without a reset, leaves the driver's
connections open and its statements unanswered; TCP still acknowledges, so no keepalive
fires. The proxy's `hang()` does exactly that. The driver must take it for an outage (one
`storage unreachable` line, exit 3 past the outage limit), and Ctrl-C must end it at once.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable

import pytest
import sqlalchemy
from outage_proxy import OutageProxy
from waiting import wait_until

from faults.harness import FAST_HEARTBEAT, DriverRun, assert_clean, fault_spec, finished_count, grid
from trialq.driver._storage.engine import ANSWER_WITHIN_S
from trialq.driver.outage import LONGEST_RETRY_S
from trialq.local import LocalCluster

pytestmark = [pytest.mark.faults, pytest.mark.integration]

OUTAGE_LIMIT_S = 5.0
EXIT_WITHIN_S = OUTAGE_LIMIT_S + 3 * ANSWER_WITHIN_S + LONGEST_RETRY_S + 5
"""Up to two unanswered waits before the outage shows, the limit, a retry after it, and its
unanswered wait."""


def test_a_hung_database_is_an_outage_and_past_the_limit_exit_3(
    run_via_proxy: DriverRun,
    proxy: OutageProxy,
    postgres_url: str,
    start_workers: Callable[..., LocalCluster],
) -> None:
    run = run_via_proxy
    start_workers(2, extra_env=FAST_HEARTBEAT)
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 1.0), 6))
    driver = run.start("--outage-limit", str(OUTAGE_LIMIT_S))
    wait_until(lambda: finished_count(run) >= 1, 120, "a trial to finish")
    proxy.hang()
    took, err = _ended(driver, EXIT_WITHIN_S)
    assert driver.returncode == 3, err
    assert took < EXIT_WITHIN_S, (took, err)
    assert sum("storage unreachable (" in line for line in err.splitlines()) == 1, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "storage unreachable for 5 s" in errors[0], err
    assert "Traceback" not in err, err
    print(f"hung database: exit 3 after {took:.1f} s (outage limit {OUTAGE_LIMIT_S:g} s)")

    _heal(proxy, postgres_url, driver.pid)
    code, err = run.run()
    assert_clean(run.judge("PostgreSQL hung > limit: exit 3, rerun", 6))
    assert code == 0, err


@pytest.mark.parametrize("after_s", [0.0, 0.1, 0.3, 1.0])
def test_ctrl_c_ends_the_driver_while_the_database_hangs_and_the_rerun_ends(
    after_s: float,
    run_via_proxy: DriverRun,
    proxy: OutageProxy,
    postgres_url: str,
    start_workers: Callable[..., LocalCluster],
) -> None:
    """Ctrl-C at any instant after the hang, the first send's record held included: the
    driver ends at once, and the rerun finds every unfinished trial's task, or takes it for
    lost within the heartbeat TTL, and ends."""
    run = run_via_proxy
    start_workers(2, extra_env=FAST_HEARTBEAT)
    run.write_spec(fault_spec("sleeps", grid("sleep_s", 1.0), 6))
    driver = run.start()
    wait_until(lambda: finished_count(run) >= 1, 120, "a trial to finish")
    proxy.hang()
    time.sleep(after_s)  # the instant of the interrupt is what this test varies
    driver.send_signal(signal.SIGINT)
    took, err = _ended(driver, 10)
    assert driver.returncode == 130, err
    assert took < 8, (took, err)  # not the 10 s bound on an answer: the interrupt comes first
    print(f"hung database: Ctrl-C {after_s:g} s in ended the driver in {took:.1f} s")

    _heal(proxy, postgres_url, driver.pid)
    code, err = run.run(timeout=120)
    assert_clean(run.judge(f"PostgreSQL hung, Ctrl-C {after_s:g} s in, rerun", 6))
    assert code == 0, err


def _ended(driver: subprocess.Popen[str], timeout_s: float) -> tuple[float, str]:
    """How long the driver took to exit, and its stderr; killed (and failed) past the limit."""
    started = time.monotonic()
    try:
        _, err = driver.communicate(timeout=timeout_s + 60)
    except subprocess.TimeoutExpired:
        driver.kill()
        _, err = driver.communicate()
        pytest.fail(f"the driver was still running {timeout_s + 60:g} s on: {err[-2000:]}")
    return time.monotonic() - started, err


def _heal(proxy: OutageProxy, postgres_url: str, driver_pid: int) -> None:
    """Let the server through again, and wait until it has ended the dead driver's session
    (its study lock goes with it)."""
    proxy.restore()
    engine = sqlalchemy.create_engine(postgres_url)
    query = sqlalchemy.text(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE :name"
    )
    name = f"trialq-driver % pid {driver_pid}"

    def gone() -> bool:
        with engine.connect() as connection:
            return connection.execute(query, {"name": name}).scalar_one() == 0

    wait_until(gone, 30, "the server to end the interrupted driver's session")
    engine.dispose()
