"""The worker image's command line, run here as a plain process against the local Redis.

The command is read from compose.yaml with the CPU override (the test checks elsewhere that it
equals the images' CMD: docker/worker-cmd.sh, run here with sh, with the CPU worker's
environment: no GPU on this machine), pointed at the tests' own Redis database
(tests/services.py), given two trials, and stopped with SIGTERM as `docker stop` would: each
trial must run in a process of its own and the worker must exit 0.

Assumed from the core package (see TODO(core) below): the task name `trialq.run_trial`
(the contract), one positional argument = `trialq.wire.messages.TrialRequest` as JSON, the result
= `trialq.wire.messages.TrialResult` as JSON, and TRIALQ_ALLOWED_MODULES gating entrypoints.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from trial_requests import trial_request

from trialq.wire.signing import Seal, stored_result_refusal

from .deployfiles import (
    COMPOSE_FILE,
    CPU_OVERRIDE_FILE,
    WORKER_CMD_SCRIPT,
    compose_model,
    find_tool,
    shell_words,
)

pytest.importorskip("trialq._celery.worker", reason="the worker module is not written yet")
celery = pytest.importorskip("celery")
messages = pytest.importorskip("trialq.wire.messages")

PROBE_MODULE = "trialq_deploy_probe"
TRIAL_TIMEOUT_S = 120
RESULT_SECRET = "entry-command-test-secret-0123456789"
STOP_TIMEOUT_S = 60

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture()
def probe_dir(tmp_path: Path) -> Path:
    """A tiny trial entrypoint the worker may import (and nothing heavy like TensorFlow)."""
    (tmp_path / f"{PROBE_MODULE}.py").write_text(
        textwrap.dedent(
            """
            import os

            def train(params, trial=None):
                return {"double_x": params["x"] * 2.0, "pid": float(os.getpid())}
            """
        ),
        encoding="utf-8",
    )
    return tmp_path


def _cpu_worker() -> dict[str, Any]:
    worker: dict[str, Any] = compose_model(COMPOSE_FILE, CPU_OVERRIDE_FILE)["services"]["worker"]
    return worker


def _worker_command() -> list[str]:
    words = shell_words(_cpu_worker()["command"])
    assert words == ["trialq-worker-cmd"], "the images' CMD, docker/worker-cmd.sh"
    assert find_tool("trialq"), "trialq is not installed (pip install -e .)"
    return ["sh", str(WORKER_CMD_SCRIPT)]


def _worker_env(probe_dir: Path, broker_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIALQ_")}
    container = _cpu_worker()["environment"]
    env.update(
        {k: str(v) for k, v in container.items() if k.startswith("TRIALQ_") and "ROOT" not in k}
    )
    env.update(
        TRIALQ_BROKER_URL=broker_url,
        TRIALQ_ALLOWED_MODULES=PROBE_MODULE,
        PYTHONPATH=os.pathsep.join(filter(None, [str(probe_dir), env.get("PYTHONPATH")])),
        # docker/worker-cmd.sh execs `trialq`, as the image's PATH finds it.
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    )
    env.pop("TRIALQ_BROKER_PASSWORD_FILE", None)
    env.pop("TRIALQ_HEARTBEAT_FILE", None)
    secret = probe_dir / "result_secret"  # the compose file's is /run/secrets/result_secret
    secret.write_text(RESULT_SECRET)
    env["TRIALQ_RESULT_SECRET_FILE"] = str(secret)
    return env


def _send_trial(client: Any, number: int, x: float) -> Any:
    # TODO(core): replace with the package's public enqueue call once it exists.
    request = trial_request(
        study="deploy-entry-command",
        number=number,
        params={"x": x},
        entrypoint=f"{PROBE_MODULE}:train",
        timeout_s=60,
    )
    task_id = str(uuid.uuid4())
    payload = Seal(RESULT_SECRET).sign_task(task_id, request.model_dump(mode="json"))
    return client.send_task("trialq.run_trial", args=[payload], task_id=task_id, queue="gpu")


def test_worker_command_takes_trials_and_stops_cleanly(
    redis_url: str, probe_dir: Path, tmp_path: Path
) -> None:
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            _worker_command(),
            env=_worker_env(probe_dir, redis_url),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    client = celery.Celery("deploy-test", broker=redis_url, backend=redis_url)
    client.conf.update(
        task_serializer="json", accept_content=["json"], result_accept_content=["json"]
    )
    try:
        results, signed = [], []
        for number, x in enumerate((1.5, 4.0)):
            sent = _send_trial(client, number, x)
            raw = sent.get(timeout=TRIAL_TIMEOUT_S)
            results.append(messages.TrialResult.model_validate(raw))
            signed.append((sent.id, raw))
        assert [r.outcome for r in results] == [messages.Outcome.OK] * 2, results
        assert [r.metrics["double_x"] for r in results] == [3.0, 8.0]
        assert all(stored_result_refusal(Seal(RESULT_SECRET), t, raw) is None for t, raw in signed)
        trial_pids = [r.worker_pid for r in results]
        assert worker.pid not in trial_pids, "a trial ran in the worker's main process"
        assert trial_pids[0] != trial_pids[1], "max-tasks-per-child 1: one process per trial"
        assert worker.poll() is None, "the worker exited after its trials"

        worker.send_signal(signal.SIGTERM)
        exit_code = worker.wait(timeout=STOP_TIMEOUT_S)
        assert exit_code == 0, log_path.read_text(errors="replace")[-3000:]
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
        client.close()
