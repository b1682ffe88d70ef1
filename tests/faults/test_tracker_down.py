"""A tracking server that is down or silent never holds the command: it ends within 60 s of
its last trial, and its stderr says the trials not recorded in one trialq line, with none of
the library's own retries (docs/tracking.md)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from waiting import wait_until

from faults.harness import DriverRun, assert_clean, fault_spec, grid
from trialq.local import LocalCluster, free_port

pytestmark = [pytest.mark.faults, pytest.mark.integration]

N_TRIALS = 3
ENDS_WITHIN_S = 60.0


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A loopback port that accepts connections and never answers a byte."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue
            except OSError:
                return

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join(timeout=5)
    for connection in [*held, listener]:
        connection.close()


def _run_with_mlflow_at(tmp_path: Path, redis_url: str, port: int, fault: str) -> str:
    """Run three quick trials tracked by MLflow at `port`; its stderr, once the command has
    ended within `ENDS_WITHIN_S` of its last trial told."""
    run = DriverRun(tmp_path, redis_url)
    spec = fault_spec("sleeps_then_echoes", grid("sleep_s", 0.1, 0.2, 0.3), N_TRIALS)
    run.write_spec(spec + f'\n[tracking.mlflow]\ntracking_uri = "http://127.0.0.1:{port}"\n')
    process = run.start()

    def all_told() -> bool:
        told = run.tell_log.read_text().split() if run.tell_log.exists() else []
        return len(told) >= N_TRIALS or process.poll() is not None

    wait_until(all_told, 120, "every trial told")
    last_told = time.monotonic()
    _, err = process.communicate(timeout=ENDS_WITHIN_S + 30)
    held_s = time.monotonic() - last_told
    assert process.returncode == 0, err
    assert_clean(run.judge(fault, N_TRIALS))
    assert held_s < ENDS_WITHIN_S, f"the command ended {held_s:.0f} s after its last trial"
    return err


def _one_trialq_line_and_no_library_noise(err: str) -> None:
    tracking = [line for line in err.splitlines() if "tracking" in line]
    assert len(tracking) == 1, err
    assert "warning: tracking: mlflow: not recorded: #" in tracking[0], err
    for noise in ("Retrying", "urllib3", "Traceback", "mlflow."):
        assert noise not in err, err


def test_an_mlflow_server_at_a_closed_port_never_holds_the_command(
    tmp_path: Path, redis_url: str, start_workers: Callable[..., LocalCluster]
) -> None:
    start_workers(1)
    err = _run_with_mlflow_at(tmp_path, redis_url, free_port(), "MLflow server at a closed port")
    _one_trialq_line_and_no_library_noise(err)


def test_an_mlflow_server_that_never_answers_never_holds_the_command(
    tmp_path: Path,
    redis_url: str,
    start_workers: Callable[..., LocalCluster],
    silent_server: int,
) -> None:
    start_workers(1)
    err = _run_with_mlflow_at(tmp_path, redis_url, silent_server, "MLflow server never answers")
    _one_trialq_line_and_no_library_noise(err)
