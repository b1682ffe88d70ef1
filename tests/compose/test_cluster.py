"""The `docker compose up` cluster built, started and broken on purpose, on a real engine.

The CPU override of the README's cluster, in a project of its own. One cluster for the module:
the tests run in file order, each leaving it healthy for the next. Skipped where no Docker
engine answers; failed in CI, where `.ci/run` starts one (../shared/containers/engine-up).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import time
import urllib.error
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import psycopg2
import pytest
import redis
from ledger import record
from waiting import wait_until

from .cluster import Cluster, engine_answers

pytestmark = [pytest.mark.compose, pytest.mark.timeout(1800)]

TRIALQ_SERVICES = ("worker", "dashboard", "flower")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if not engine_answers():
        if os.environ.get("CI") == "true":
            pytest.fail("the compose tests need a Docker engine in CI (.ci/run starts one)")
        pytest.skip("no Docker engine with Compose v2 answers")
    cluster = Cluster(tmp_path_factory.mktemp("cluster"))
    cluster.compose("build", timeout=1800)
    started = time.monotonic()
    cluster.compose("up", "-d", "--wait", timeout=300)
    cluster.cold_start_s = time.monotonic() - started  # type: ignore[attr-defined]
    yield cluster
    record("compose_cold_start", {"seconds": cluster.cold_start_s})  # type: ignore[attr-defined]
    cluster.remove_all_containers()  # a `run` container too, which `down` leaves
    cluster.compose("down", "-v", "--remove-orphans", "--timeout", "5", check=False)


def _sent_again(cluster: Cluster, study: str) -> bool:
    """Whether the driver has recorded a trial's second attempt: it sent the trial again."""
    return any(t.user_attrs.get("attempts", 1) > 1 for t in cluster.study(study).trials)


def _spec_folder(tmp_path: Path, name: str, n_trials: int, sleep_s: float) -> Path:
    (tmp_path / "study.toml").write_text(
        textwrap.dedent(
            f"""
            [study]
            name = "{name}"
            metric = "score"
            n_trials = {n_trials}
            max_in_flight = 1
            sampler = "random"
            pruner = "none"
            [trial]
            entrypoint = "trialq.examples.sleeper:train"
            timeout_s = 120
            [space.x]
            type = "float"
            low = -2
            high = 2
            [space.sleep_s]
            type = "categorical"
            choices = [{sleep_s}]
            """
        )
    )
    tmp_path.chmod(0o755)
    (tmp_path / "study.toml").chmod(0o644)
    return tmp_path


def test_every_service_comes_up_healthy_and_storage_init_completes(cluster: Cluster) -> None:
    services = cluster.services()
    for name in ("redis", "postgres", "worker", "dashboard", "flower"):
        assert services[name]["State"] == "running", services[name]
        assert services[name]["Health"] == "healthy", services[name]
    assert services["storage-init"]["State"] == "exited"
    assert services["storage-init"]["ExitCode"] == 0


def test_the_readme_driver_command_runs_trials_each_in_its_own_process(
    cluster: Cluster,
) -> None:
    done = cluster.compose(
        "run", "--rm", "driver", "submit-study", "/app/examples/digits/study.toml",
        "--n-trials", "3", "--json", "--no-progress", timeout=900,
    )  # fmt: skip
    summary = json.loads(done.stdout.strip().splitlines()[-1])  # after any build output
    assert summary["n_complete"] + summary["n_pruned"] + summary["n_failed"] == 3, done.stderr
    pids = {t["user_attrs"]["worker_pid"] for t in summary["trials"]}
    assert len(pids) == 3, "each trial runs in a fresh process"
    studies = cluster.http("DASHBOARD_PORT", "/api/studies")
    assert "digits-cnn" in {s["study_name"] for s in studies["study_summaries"]}
    login = ("trialq", cluster.passwords["FLOWER"])
    tasks = cluster.http("FLOWER_PORT", "/api/tasks", login=login)
    assert {t["user_attrs"]["task_id"] for t in summary["trials"]} <= set(tasks), tasks.keys()
    with pytest.raises(urllib.error.HTTPError) as refused:
        cluster.http("FLOWER_PORT", "/api/tasks")
    assert refused.value.code == 401, "Flower's API needs its login"


@pytest.mark.parametrize(
    ("fault", "action"),
    [
        ("compose: restart redis mid-trial", "restart_redis"),
        ("compose: kill the worker mid-trial, start", "kill_worker"),
        ("compose: restart postgres mid-study", "restart_postgres"),
    ],
)
def test_a_container_fault_mid_study_loses_nothing(
    cluster: Cluster, tmp_path: Path, fault: str, action: str
) -> None:
    name = f"fault-{action}"
    driver = cluster.start_driver(_spec_folder(tmp_path, name, n_trials=4, sleep_s=4))
    wait_until(lambda: cluster.running_trials(name) >= 1, 180, "a trial to start", 0.5)
    time.sleep(1.5)
    if action == "restart_redis":
        cluster.compose("restart", "redis")
    elif action == "kill_worker":
        cluster.compose("kill", "worker")
        time.sleep(2)
        cluster.compose("start", "worker")
    else:
        cluster.compose("restart", "postgres")
    _, log = driver.communicate(timeout=600)
    verdict = cluster.judge(fault, name, 4, log)
    record("compose", asdict(verdict))
    assert driver.returncode == 0, log[-3000:]
    assert verdict.passed, (verdict, log[-3000:])


def test_a_worker_cut_off_from_redis_past_its_heartbeat_ttl_is_told_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    name = "fault-partition"
    network = f"{cluster.project}_queue"
    worker = cluster.container("worker")
    driver = cluster.start_driver(_spec_folder(tmp_path, name, n_trials=3, sleep_s=6))
    wait_until(lambda: cluster.running_trials(name) >= 1, 180, "a trial to start", 0.5)
    subprocess.run(["docker", "network", "disconnect", network, worker], check=True)
    # Past the heartbeat's TTL (20 s) the driver takes the worker for lost and sends again.
    sent_again = "the driver to take the cut-off worker for lost and send its trial again"
    wait_until(lambda: _sent_again(cluster, name), 180, sent_again, 0.5)
    subprocess.run(["docker", "network", "connect", network, worker], check=True)
    _, log = driver.communicate(timeout=600)
    verdict = cluster.judge("compose: worker partitioned till lost", name, 3, log)
    record("compose", asdict(verdict))
    assert driver.returncode == 0, log[-3000:]
    assert verdict.passed, (verdict, log[-3000:])


def test_down_and_up_with_the_volumes_kept_then_the_study_resumes(
    cluster: Cluster, tmp_path: Path
) -> None:
    name = "fault-down-up"
    folder = _spec_folder(tmp_path, name, n_trials=4, sleep_s=3)
    driver = cluster.start_driver(folder)
    wait_until(lambda: cluster.running_trials(name) >= 1, 180, "a trial to start", 0.5)
    # `down` leaves a `run` container alone (Compose's one-off containers): stop the driver
    # first, as docker/README.md says; it resumes cleanly.
    running = cluster.containers_of("driver")
    assert running, "the driver's run container"
    subprocess.run(["docker", "stop", "-t", "10", *running], check=True, capture_output=True)
    driver.communicate(timeout=60)
    cluster.compose("down", "--timeout", "5", timeout=120)
    cluster.compose("up", "-d", "--wait", timeout=300)
    rerun = cluster.start_driver(folder)
    _, log = rerun.communicate(timeout=600)
    verdict = cluster.judge("compose: down, up, submit-study again", name, 4, log)
    record("compose", asdict(verdict))
    assert rerun.returncode == 0, log[-3000:]
    assert verdict.passed, (verdict, log[-3000:])


def test_the_services_refuse_the_host_without_a_password(cluster: Cluster) -> None:
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(port=cluster.ports["REDIS_HOST_PORT"]).ping()
    with pytest.raises(psycopg2.OperationalError, match="password"):
        psycopg2.connect(
            host="127.0.0.1", port=cluster.ports["POSTGRES_HOST_PORT"], user="trialq",
            dbname="optuna", connect_timeout=5,
        )  # fmt: skip


def test_no_password_shows_in_a_command_line_the_logs_the_environment_or_an_image(
    cluster: Cluster,
) -> None:
    passwords = cluster.passwords.values()
    command_lines = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    logs = cluster.compose("logs", "--no-color").stdout
    containers = cluster.compose("ps", "-aq").stdout.split()
    inspected = subprocess.run(
        ["docker", "inspect", *containers], capture_output=True, text=True, check=True
    ).stdout
    history = "".join(
        subprocess.run(
            ["docker", "history", "--no-trunc", image], capture_output=True, text=True
        ).stdout
        for image in ("trialq-driver:0.1.0", "trialq-worker-cpu:0.1.0")
    )
    for place, text in (
        ("a command line", command_lines),
        ("the logs", logs),
        ("docker inspect", inspected),
        ("an image's history", history),
    ):
        assert not any(password in text for password in passwords), f"a password in {place}"


def test_every_trialq_process_is_non_root_with_no_capabilities(cluster: Cluster) -> None:
    for service in TRIALQ_SERVICES:
        container = cluster.container(service)
        info = json.loads(
            subprocess.run(
                ["docker", "inspect", container], capture_output=True, text=True, check=True
            ).stdout
        )[0]
        assert info["HostConfig"]["CapDrop"] == ["ALL"], service
        assert "no-new-privileges:true" in info["HostConfig"]["SecurityOpt"], service
        top = subprocess.run(
            ["docker", "top", container, "-eo", "uid,pid"], capture_output=True, text=True,
            check=True,
        ).stdout.splitlines()[1:]  # fmt: skip
        assert top, service
        for line in top:
            uid, pid = line.split()
            assert uid != "0", f"{service}: a process runs as root"
            status = Path(f"/proc/{pid}/status").read_text()
            effective = next(x for x in status.splitlines() if x.startswith("CapEff:"))
            assert int(effective.split()[1], 16) == 0, f"{service}: {effective}"


def test_the_gpu_worker_image_builds_imports_tensorflow_and_joins_the_queue(
    cluster: Cluster,
) -> None:
    image = _build_worker_image(cluster, "tf")
    imported = subprocess.run(
        ["docker", "run", "--rm", image, "python3", "-c", "import tensorflow; print('ok')"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert imported.stdout.strip().endswith("ok"), imported.stderr[-2000:]
    _joins_the_queue(cluster, image, "gpu-image-check")


# What each framework's image must import, and what it preloads in the worker's parent.
FRAMEWORK_IMAGES = {
    "torch": ("torch", "torch,torch._dynamo"),
    "jax": ("jax", "jax"),
}


@pytest.mark.parametrize("framework", sorted(FRAMEWORK_IMAGES))
def test_the_framework_worker_images_build_import_their_framework_only_and_join_the_queue(
    cluster: Cluster, framework: str
) -> None:
    """On the python stand-in (no CUDA here): the framework with its CUDA wheels, no
    TensorFlow, the preload the image names, and a worker that preloads it and beats."""
    module, preload = FRAMEWORK_IMAGES[framework]
    image = _build_worker_image(cluster, framework)
    probe = (
        "import importlib.util, os; "
        f"import {module}; "
        "print(os.environ['TRIALQ_PRELOAD'], importlib.util.find_spec('tensorflow') is None)"
    )
    imported = subprocess.run(
        ["docker", "run", "--rm", image, "python3", "-c", probe],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert imported.stdout.split() == [preload, "True"], imported.stderr[-2000:]
    _joins_the_queue(cluster, image, f"{framework}-image-check")


def _build_worker_image(cluster: Cluster, framework: str) -> str:
    image = f"{cluster.project}-worker-{framework}:test"
    subprocess.run(
        ["docker", "build", "-q", "-f", f"docker/worker-{framework}.Dockerfile", "-t", image, "."],
        cwd=Path(__file__).parents[2], check=True, capture_output=True, timeout=1500,
        env={**os.environ, "DOCKER_BUILDKIT": "0"},
    )  # fmt: skip
    return image


def _joins_the_queue(cluster: Cluster, image: str, hostname: str) -> None:
    """The image's own CMD (its CPU form: no GPU here) beats in the cluster's Redis."""
    secret = cluster.env_file.parent / "redis_password"
    secret.write_text(cluster.passwords["REDIS"])
    secret.chmod(0o644)
    worker = subprocess.run(
        [
            "docker", "run", "-d", "--rm", "--network", f"{cluster.project}_queue",
            "--hostname", hostname, "-v", f"{secret}:/run/secrets/redis_password:ro",
            "-e", "TRIALQ_BROKER_URL=redis://redis:6379/0",
            "-e", "TRIALQ_BROKER_PASSWORD_FILE=/run/secrets/redis_password",
            "-e", "TRIALQ_GPUS=", image,  # no GPU here: its CMD's CPU form
        ],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    try:
        client = redis.Redis.from_url(cluster.broker_url)
        wait_until(
            lambda: any(f"@{hostname}".encode() in k for k in client.scan_iter("trialq:worker:*")),
            120,
            f"the worker of {image} to beat",
            0.5,
        )
    finally:
        subprocess.run(["docker", "rm", "-f", worker], capture_output=True)
