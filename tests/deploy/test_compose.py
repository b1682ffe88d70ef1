"""The Compose cluster (compose.yaml, compose.cpu.yaml) against the design in docker/README.md.

No Docker engine is needed: the files are read as data, validated against the vendored
Compose schema, and, where a Compose v2 client exists, rendered by `docker compose config`.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from waiting import wait_for_redis

from .deployfiles import (
    COMPOSE_FILE,
    CPU_OVERRIDE_FILE,
    ENV_EXAMPLE,
    FRAMEWORKS,
    REPO_ROOT,
    TEST_ENV,
    WORKER_DOCKERFILES,
    compose_cli,
    compose_model,
    dockerfile_instructions,
    env_example,
    find_tool,
    interpolate,
    load_yaml,
    shell_words,
    worker_argv,
)

SCHEMA_FILE = Path(__file__).with_name("compose-spec.json")
WORKER = "worker"
WORKER_DOCKERFILE = WORKER_DOCKERFILES["tf"]  # the default framework's
# Options of Celery's own `celery worker` that the images' command passes through trialq.
CELERY_WORKER_OPTIONS = {"--max-tasks-per-child"}
# The worker's settings in .env, with the defaults compose.yaml gives them.
WORKER_SETTINGS = {
    "TRIALQ_FRAMEWORK": "tf",
    "TRIALQ_GPUS": "all",
    "TRIALQ_TRIALS_PER_GPU": "1",
    "TRIALQ_GPU_MEMORY_MB": "",
    "TRIALQ_GPU_INTERPOSER": "",
    "TRIALQ_QUEUE": "gpu",
}
DASHBOARD = "dashboard"
# A trial's hard limit with the spec's default timeout_s (3600) and the 60 s grace.
DEFAULT_TRIAL_HARD_LIMIT_S = 3600 + 60


@pytest.fixture(scope="module")
def model() -> dict[str, Any]:
    return compose_model(COMPOSE_FILE)


@pytest.fixture(scope="module")
def services(model: dict[str, Any]) -> dict[str, Any]:
    return model["services"]


@pytest.fixture(scope="module")
def workers(services: dict[str, Any]) -> dict[str, Any]:
    found = {name: svc for name, svc in services.items() if name.startswith("worker")}
    assert found, "compose.yaml defines no worker service"
    return found


def _validate(instance: Any) -> None:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    jsonschema.Draft7Validator(schema).validate(instance)


def _published_ports(service: dict[str, Any]) -> list[dict[str, str]]:
    """Each published port as {'host_ip', 'published', 'target'} (short or long syntax)."""
    ports = []
    for entry in service.get("ports", []):
        if isinstance(entry, dict):
            ports.append(
                {
                    "host_ip": entry.get("host_ip", ""),
                    "published": str(entry.get("published", "")),
                    "target": str(entry["target"]),
                }
            )
            continue
        parts = str(entry).split(":")
        host_ip = parts[0] if len(parts) == 3 else ""
        ports.append(
            {
                "host_ip": host_ip,
                "published": parts[-2] if len(parts) > 1 else "",
                "target": parts[-1],
            }
        )
    return ports


def _duration_s(text: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|h|m|s)", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a duration: {text!r}"
    return sum(float(number) * units[unit] for number, unit in parts)


# --- the files are valid Compose -------------------------------------------------------------


def test_compose_file_matches_the_compose_schema() -> None:
    _validate(load_yaml(COMPOSE_FILE))


def test_cpu_override_merged_matches_the_compose_schema() -> None:
    _validate(compose_model(COMPOSE_FILE, CPU_OVERRIDE_FILE))


def test_schema_rejects_a_broken_device_reservation() -> None:
    """The validation can fail: a device reservation with a typo is refused."""
    broken = load_yaml(COMPOSE_FILE)
    device = broken["services"][WORKER]["deploy"]["resources"]["reservations"]["devices"][0]
    device["capability"] = device.pop("capabilities")
    with pytest.raises(jsonschema.ValidationError):
        _validate(broken)


# --- GPU workers -----------------------------------------------------------------------------


def test_one_worker_service_takes_every_gpu_of_the_host(
    services: dict[str, Any], workers: dict[str, Any]
) -> None:
    """No block per GPU: one service, all of the host's GPUs through the NVIDIA runtime."""
    assert list(workers) == [WORKER]
    worker_images = [n for n, svc in services.items() if "trialq-worker" in svc["image"]]
    assert worker_images == [WORKER]
    assert "profiles" not in workers[WORKER], "the worker starts with `docker compose up`"
    (device,) = workers[WORKER]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert device["capabilities"] == ["gpu"]
    assert device["count"] == "all"
    assert "device_ids" not in device, "count and device_ids exclude each other"


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_the_framework_in_env_picks_the_worker_image(framework: str) -> None:
    worker = compose_model(COMPOSE_FILE, env={**TEST_ENV, "TRIALQ_FRAMEWORK": framework})[
        "services"
    ][WORKER]
    dockerfile = REPO_ROOT / worker["build"]["dockerfile"]
    assert dockerfile == WORKER_DOCKERFILES[framework] and dockerfile.is_file()
    assert worker["image"] == f"trialq-worker-{framework}:0.1.0"
    assert worker["pull_policy"] == "build"


def test_the_worker_environment_carries_its_gpus_and_slots_from_env(tmp_path: Path) -> None:
    env = {
        **TEST_ENV,
        "TRIALQ_GPUS": "GPU-1b2c,MIG-9f8e",
        "TRIALQ_TRIALS_PER_GPU": "4",
        "TRIALQ_GPU_MEMORY_MB": "12000",
        "TRIALQ_QUEUE": "gpu-80gb",
    }
    environment = compose_model(COMPOSE_FILE, env=env)["services"][WORKER]["environment"]
    for name in ("TRIALQ_GPUS", "TRIALQ_TRIALS_PER_GPU", "TRIALQ_GPU_MEMORY_MB", "TRIALQ_QUEUE"):
        assert environment[name] == env[name], name
    argv = worker_argv(environment, tmp_path)
    assert argv == [
        "trialq", "worker", "--queue", "gpu-80gb", "--gpus", "GPU-1b2c,MIG-9f8e",
        "--trials-per-gpu", "4", "--gpu-memory-mb", "12000", "--max-tasks-per-child", "1",
    ]  # fmt: skip


def test_the_worker_defaults_to_all_gpus_one_slot_each_and_no_fixed_budget(
    workers: dict[str, Any], tmp_path: Path
) -> None:
    environment = workers[WORKER]["environment"]
    assert {k: environment[k] for k in WORKER_SETTINGS if k in environment} == {
        k: v for k, v in WORKER_SETTINGS.items() if k != "TRIALQ_FRAMEWORK"
    }
    argv = worker_argv(environment, tmp_path)
    assert "--gpu-memory-mb" not in argv, "an empty budget is left to the worker"
    pairs = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert pairs == {
        "--queue": "gpu",
        "--gpus": "all",
        "--trials-per-gpu": "1",
        "--max-tasks-per-child": "1",
    }


def test_env_example_sets_the_defaults_compose_has(tmp_path: Path) -> None:
    """Copying .env.example changes nothing but the passwords and the secret you fill in."""
    example = env_example()
    filled_in = ("_PASSWORD", "_SECRET")
    assert {k: v for k, v in example.items() if k.endswith(filled_in)} == {
        "REDIS_PASSWORD": "",
        "POSTGRES_PASSWORD": "",
        "FLOWER_PASSWORD": "",
        "RESULT_SECRET": "",
    }
    assert {k: v for k, v in example.items() if not k.endswith(filled_in)} == WORKER_SETTINGS
    with_example = compose_model(COMPOSE_FILE, env={**example, **TEST_ENV})
    assert with_example == compose_model(COMPOSE_FILE)


def test_worker_command_runs_one_trial_per_process(workers: dict[str, Any], tmp_path: Path) -> None:
    for name, worker in workers.items():
        words = worker_argv(worker["environment"], tmp_path)
        assert words[:2] == ["trialq", "worker"], name
        pairs = dict(zip(words[2::2], words[3::2], strict=True))
        assert pairs["--max-tasks-per-child"] == "1", name
        assert pairs["--queue"] == "gpu", name


def test_worker_command_is_every_worker_image_cmd(workers: dict[str, Any]) -> None:
    for framework, dockerfile in WORKER_DOCKERFILES.items():
        cmd = [args for keyword, args in dockerfile_instructions(dockerfile) if keyword == "CMD"]
        assert cmd, f"{dockerfile.name} has no CMD"
        for name, worker in workers.items():
            assert shell_words(worker["command"]) == json.loads(cmd[-1]), (name, framework)


def test_the_worker_flags_are_the_clis(workers: dict[str, Any], tmp_path: Path) -> None:
    """Every option docker/worker-cmd.sh passes is one `trialq worker` knows."""
    trialq = find_tool("trialq")
    if trialq is None:
        pytest.skip("trialq is not installed (pip install -e .)")
    usage = subprocess.run(
        [trialq, "worker", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    if "--trials-per-gpu" not in usage:
        pytest.skip(
            "`trialq worker` has no --gpus/--trials-per-gpu/--gpu-memory-mb yet (issue 27.3 "
            "adds them in cli.py); this test checks the images' command against them then"
        )
    environment = {**workers[WORKER]["environment"], "TRIALQ_GPU_MEMORY_MB": "8000"}
    flags = {w for w in worker_argv(environment, tmp_path) if w.startswith("--")}
    for flag in flags - CELERY_WORKER_OPTIONS:
        assert flag in usage, f"docker/worker-cmd.sh passes {flag}, unknown to `trialq worker`"
    # `trialq worker` hands the options it does not know to Celery's own worker command.
    celery = find_tool("celery")
    assert celery, "celery is not installed"
    celery_usage = subprocess.run(
        [celery, "worker", "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    assert all(option in celery_usage for option in flags & CELERY_WORKER_OPTIONS)


def test_worker_environment(workers: dict[str, Any]) -> None:
    for name, worker in workers.items():
        env = worker["environment"]
        assert env["TRIALQ_BROKER_URL"] == "redis://redis:6379/0", name
        assert env["TRIALQ_BROKER_PASSWORD_FILE"] == "/run/secrets/redis_password", name
        assert env["TRIALQ_RESULT_SECRET_FILE"] == "/run/secrets/result_secret", name
        assert worker["secrets"] == ["redis_password", "result_secret"], (
            f"{name}: the Redis password and the result secret only"
        )
        assert "TRIALQ_STORAGE" not in env, f"{name}: workers talk only to Redis"
        # A framework's own settings belong to its image (and trialq's adapter), not to a
        # service that runs whichever image TRIALQ_FRAMEWORK names.
        assert not [k for k in env if k.startswith(("TF_", "XLA_", "PYTORCH_", "TRIALQ_PRELOAD"))]


def test_no_password_is_in_any_environment(services: dict[str, Any]) -> None:
    """Passwords reach the containers as secret files: `docker inspect` shows environments."""
    for name, service in services.items():
        env = " ".join(str(v) for v in (service.get("environment") or {}).values())
        for password in TEST_ENV.values():
            assert password not in env, f"{name}: a password in its environment"


def test_workers_are_kept_off_the_storage_network(
    services: dict[str, Any], workers: dict[str, Any]
) -> None:
    storage_networks = set(services["postgres"]["networks"])
    for name, worker in workers.items():
        assert not storage_networks & set(worker["networks"]), name


def test_worker_stop_grace_outlasts_a_trial_hard_limit(workers: dict[str, Any]) -> None:
    for name, worker in workers.items():
        assert _duration_s(worker["stop_grace_period"]) > DEFAULT_TRIAL_HARD_LIMIT_S, name


def test_workers_run_without_capabilities(workers: dict[str, Any]) -> None:
    for name, worker in workers.items():
        assert worker["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in worker["security_opt"], name


# --- Redis -----------------------------------------------------------------------------------


def _redis_config_lines(services: dict[str, Any]) -> list[str]:
    """The redis.conf the service feeds redis-server on stdin (its heredoc)."""
    script = shell_words(services["redis"]["command"])[-1]
    assert "redis-server -" in script, "redis-server must read its configuration from stdin"
    body = script.split("<<EOF", 1)[1].rsplit("EOF", 1)[0]
    return [line.strip() for line in body.strip().splitlines()]


def test_redis_has_password_persistence_and_noeviction(services: dict[str, Any]) -> None:
    config = dict(line.split(" ", 1) for line in _redis_config_lines(services))
    assert config["requirepass"] == "$(cat /run/secrets/redis_password)"
    assert config["appendonly"] == "yes"
    assert config["maxmemory-policy"] == "noeviction"
    assert config["dir"] == "/data"
    volumes = services["redis"]["volumes"]
    assert any(str(v).endswith(":/data") for v in volumes), "AOF must live on a volume"
    assert services["redis"]["secrets"] == ["redis_password"]


def test_redis_password_never_appears_on_a_command_line(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for key in ("command", "entrypoint"):
            if key in service:
                words = " ".join(shell_words(service[key]))
                assert TEST_ENV["REDIS_PASSWORD"] not in words, f"{name}.{key}"
                assert TEST_ENV["POSTGRES_PASSWORD"] not in words, f"{name}.{key}"


def test_passwords_have_no_default() -> None:
    """Without .env, Compose must refuse to start rather than run with a known password."""
    for variable in TEST_ENV:
        env = {k: v for k, v in TEST_ENV.items() if k != variable}
        with pytest.raises(KeyError, match=variable):
            compose_model(COMPOSE_FILE, env=env)
        with pytest.raises(KeyError, match=variable):
            compose_model(COMPOSE_FILE, env={**env, variable: ""})


def test_env_example_ships_no_secret() -> None:
    values = env_example()
    assert not [k for k, v in values.items() if re.search("PASSWORD|SECRET|TOKEN", k) and v]
    assert ENV_EXAMPLE.name == ".env.example"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_redis_command_runs_and_enforces_its_config(
    services: dict[str, Any], tmp_path: Path
) -> None:
    """The service's own shell command, run here on a free port with a temporary data dir."""
    if find_tool("redis-server") is None:
        pytest.skip("redis-server not installed")
    redis = pytest.importorskip("redis")
    script = shell_words(services["redis"]["command"])[-1]
    port = _free_port()
    secret = tmp_path / "redis_password"
    secret.write_text("local-test-pw\n")
    script = script.replace("dir /data", f"dir {tmp_path}\nport {port}\nbind 127.0.0.1")
    script = script.replace("/run/secrets/redis_password", str(secret))
    env = {**os.environ, "REDIS_MAXMEMORY": "32mb"}
    server = subprocess.Popen(["sh", "-c", script], env=env, stdout=subprocess.DEVNULL)
    try:
        client = wait_for_redis(redis.Redis(port=port, password="local-test-pw"), timeout_s=5)
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).ping()
        argv = Path(f"/proc/{server.pid}/cmdline").read_bytes()
        assert b"local-test-pw" not in argv
    finally:
        server.terminate()
        server.wait(timeout=10)


# --- exposure, images, start order -----------------------------------------------------------


def test_only_the_dashboard_listens_beyond_the_host(services: dict[str, Any]) -> None:
    assert [p["host_ip"] for p in _published_ports(services[DASHBOARD])] == ["0.0.0.0"]
    for name, service in services.items():
        if name == DASHBOARD:
            continue
        for port in _published_ports(service):
            assert port["host_ip"] == "127.0.0.1", f"{name} publishes {port} beyond loopback"


def test_flower_is_on_loopback(services: dict[str, Any]) -> None:
    ports = _published_ports(services["flower"])
    assert ports and all(p["host_ip"] == "127.0.0.1" for p in ports)
    assert "flower" in shell_words(services["flower"]["command"])


def test_every_image_is_pinned_by_version(model: dict[str, Any]) -> None:
    for name, service in model["services"].items():
        image = service.get("image")
        assert image, f"{name} has no image name (an untagged build)"
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag, f"{name}: {image} has no tag"
        assert tag != "latest" and re.search(r"\d", tag), f"{name}: {image} is not pinned"


def test_dockerfile_base_images_are_pinned() -> None:
    for dockerfile in (REPO_ROOT / "docker").glob("*.Dockerfile"):
        defaults = {}
        for keyword, args in dockerfile_instructions(dockerfile):
            if keyword == "ARG" and "=" in args:
                name, value = args.split("=", 1)
                defaults[name] = value
            if keyword == "FROM":
                image = interpolate(args.split()[0], defaults)
                assert re.search(r":[^:/]*\d", image), f"{dockerfile.name}: FROM {image}"
                assert not image.endswith(":latest"), f"{dockerfile.name}: FROM {image}"


def test_start_order_waits_for_health(services: dict[str, Any]) -> None:
    """Long-running services are waited for until healthy, one-shot ones until they succeed.
    A worker only until Redis has started: it imports TensorFlow meanwhile, and Celery waits
    for its broker itself (broker_connection_retry_on_startup)."""
    from trialq._celery.app import celery_config
    from trialq.settings import Settings

    assert celery_config(Settings())["broker_connection_retry_on_startup"] is True
    for name, service in services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            if services[dependency].get("restart") == "no":
                assert condition["condition"] == "service_completed_successfully", name
            elif name == WORKER and dependency == "redis":
                assert condition["condition"] == "service_started", name
            else:
                assert condition["condition"] == "service_healthy", f"{name} -> {dependency}"
                assert _has_healthcheck(services[dependency], dependency), dependency
    assert set(services["driver"]["depends_on"]) == {"redis", "storage-init", WORKER}
    assert set(services[WORKER]["depends_on"]) == {"redis"}
    assert set(services[DASHBOARD]["depends_on"]) == {"storage-init"}
    assert set(services["storage-init"]["depends_on"]) == {"postgres"}


def test_storage_schema_is_created_before_the_dashboard_opens_it(services: dict[str, Any]) -> None:
    """optuna-dashboard opens an RDB storage with skip_table_creation=True."""
    script = shell_words(services["storage-init"]["command"])[-1]
    assert "RDBStorage(" in script
    assert (
        services["storage-init"]["environment"]["TRIALQ_STORAGE"]
        == (services[DASHBOARD]["environment"]["TRIALQ_STORAGE"])
    )


def _has_healthcheck(service: dict[str, Any], name: str) -> bool:
    if "healthcheck" in service:
        return not service["healthcheck"].get("disable", False)
    if name == WORKER:  # every worker image's HEALTHCHECK
        return all(
            "HEALTHCHECK" in [k for k, _ in dockerfile_instructions(dockerfile)]
            for dockerfile in WORKER_DOCKERFILES.values()
        )
    return False


def test_driver_is_one_shot_under_a_profile(services: dict[str, Any]) -> None:
    driver = services["driver"]
    assert driver["profiles"] == ["driver"]
    assert driver["restart"] == "no"
    assert shell_words(driver["command"])[0] == "submit-study"
    assert (
        driver["environment"]["TRIALQ_STORAGE"]
        == "postgresql+psycopg2://trialq@postgres:5432/optuna"
    )
    assert driver["environment"]["TRIALQ_STORAGE_PASSWORD_FILE"] == "/run/secrets/postgres_password"
    assert driver["image"].startswith("trialq-driver:")


def test_the_driver_and_the_workers_alone_hold_the_result_secret(
    services: dict[str, Any],
) -> None:
    """Trials sign their results, the driver checks them (docs/deployment.md#security): both
    mount the same secret file; no other service gets it."""
    holders = {
        name for name, service in services.items() if "result_secret" in service.get("secrets", [])
    }
    assert holders == {"driver", WORKER}
    for name in holders:
        env = services[name]["environment"]
        assert env["TRIALQ_RESULT_SECRET_FILE"] == "/run/secrets/result_secret", name


def test_each_trialq_image_is_built_by_one_service_and_never_pulled(
    services: dict[str, Any],
) -> None:
    """Four services run the driver image: built in parallel it was built twice (a dangling
    590 MB image), and Compose looked for trialq-* in a registry first."""
    by_image: dict[str, list[str]] = {}
    for name, service in services.items():
        if service["image"].startswith("trialq-"):
            by_image.setdefault(service["image"], []).append(name)
    for image, users in by_image.items():
        builders = [n for n in users if "build" in services[n]]
        assert len(builders) == 1, f"{image} is built by {builders}"
        assert services[builders[0]]["pull_policy"] == "build", builders[0]
        for name in set(users) - set(builders):
            assert services[name]["pull_policy"] == "never", f"{name} would pull {image}"


def test_postgres_is_healthy_only_once_it_listens_on_tcp(services: dict[str, Any]) -> None:
    """pg_isready without --host asks the Unix socket, which answers during the image's
    socket-only first-start phase: storage-init would start before TCP is open."""
    test = shell_words(services["postgres"]["healthcheck"]["test"])
    assert "pg_isready" in test
    assert test[test.index("--host") + 1] == "127.0.0.1"


def test_postgres_keeps_the_study_on_a_volume(model: dict[str, Any]) -> None:
    postgres = model["services"]["postgres"]
    assert any(str(v).endswith(":/var/lib/postgresql/data") for v in postgres["volumes"])
    assert "postgres-data" in model["volumes"]


# --- the CPU override ------------------------------------------------------------------------


def test_cpu_override_removes_every_gpu_reservation(tmp_path: Path) -> None:
    merged = compose_model(COMPOSE_FILE, CPU_OVERRIDE_FILE)
    worker = merged["services"][WORKER]
    assert worker["build"]["args"]["TRIALQ_EXTRA"] == "cpu"
    assert "tensorflow" not in worker["build"]["args"]["BASE_IMAGE"]
    assert worker["build"]["args"]["TRIALQ_GPUS"] == "", "the CPU image takes no GPU itself"
    assert REPO_ROOT / worker["build"]["dockerfile"] == WORKER_DOCKERFILES["tf"]
    assert "deploy" not in worker, "the CPU worker keeps its GPU reservation"
    assert "ulimits" not in worker, "memlock -1 stops a worker on some engines"
    assert worker["image"] == "trialq-worker-cpu:0.1.0"
    assert worker["image"] != compose_model(COMPOSE_FILE)["services"][WORKER]["image"], (
        "the CPU build must not overwrite the GPU image's tag"
    )
    assert worker_argv(worker["environment"], tmp_path) == [
        "trialq", "worker", "--queue", "gpu", "--concurrency", "1", "--max-tasks-per-child", "1",
    ]  # fmt: skip
    torch = compose_model(
        COMPOSE_FILE, CPU_OVERRIDE_FILE, env={**TEST_ENV, "TRIALQ_FRAMEWORK": "torch"}
    )
    assert torch["services"][WORKER]["image"] == "trialq-worker-cpu:0.1.0"


# --- docker compose itself (client only) -----------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> list[str]:
    command = compose_cli()
    if command is None:
        pytest.skip("no Docker Compose v2 client (docker compose / docker-compose) here")
    return command


def _compose_config(
    compose: list[str],
    *files: Path,
    env: dict[str, str],
    profiles: tuple[str, ...] = (),
    extra: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """`docker compose config` on the files, with only `env` as the variables (no .env)."""
    options = [arg for path in files for arg in ("-f", str(path))]
    options += [arg for profile in profiles for arg in ("--profile", profile)]
    options += ["--project-directory", str(REPO_ROOT), "--env-file", os.devnull]
    clean_env = {
        k: v for k, v in os.environ.items() if k not in TEST_ENV and not k.startswith("COMPOSE_")
    }
    return subprocess.run(
        [*compose, *options, "config", *extra],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean_env, **env},
        cwd=REPO_ROOT,
    )


def test_docker_compose_config_accepts_the_files(compose: list[str]) -> None:
    done = _compose_config(compose, COMPOSE_FILE, env=TEST_ENV, extra=("-q",))
    assert done.returncode == 0, done.stderr
    done = _compose_config(compose, COMPOSE_FILE, CPU_OVERRIDE_FILE, env=TEST_ENV, extra=("-q",))
    assert done.returncode == 0, done.stderr


def test_docker_compose_refuses_to_run_without_passwords(compose: list[str]) -> None:
    done = _compose_config(compose, COMPOSE_FILE, env={}, extra=("-q",))
    assert done.returncode != 0
    assert "REDIS_PASSWORD" in done.stderr or "POSTGRES_PASSWORD" in done.stderr


def test_docker_compose_cpu_override_drops_reservations(compose: list[str]) -> None:
    options: dict[str, Any] = {
        "env": TEST_ENV,
        "profiles": ("driver",),
        "extra": ("--format", "json"),
    }
    gpu = json.loads(_compose_config(compose, COMPOSE_FILE, **options).stdout)
    cpu = json.loads(_compose_config(compose, COMPOSE_FILE, CPU_OVERRIDE_FILE, **options).stdout)
    assert [name for name in gpu["services"] if name.startswith("worker")] == [WORKER]
    (device,) = gpu["services"][WORKER]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert device["count"] == -1, "Compose writes `count: all` as -1"
    assert "deploy" not in cpu["services"][WORKER]
    assert "ulimits" not in cpu["services"][WORKER]
    assert cpu["services"][WORKER]["image"] == "trialq-worker-cpu:0.1.0"
    assert cpu["services"][WORKER]["build"]["args"]["TRIALQ_EXTRA"] == "cpu"
    assert cpu["services"][WORKER]["environment"]["TRIALQ_GPUS"] == ""
    assert "driver" in gpu["services"]


def test_docker_compose_reads_the_workers_settings_from_env_file(
    compose: list[str], tmp_path: Path
) -> None:
    """The README's way: .env.example copied, passwords and settings filled in."""
    lines = ENV_EXAMPLE.read_text(encoding="utf-8").splitlines()
    chosen = {
        **TEST_ENV,
        "TRIALQ_FRAMEWORK": "jax",
        "TRIALQ_GPUS": "0,1",
        "TRIALQ_TRIALS_PER_GPU": "2",
        "TRIALQ_GPU_MEMORY_MB": "20000",
    }
    env_file = tmp_path / ".env"
    env_file.write_text(
        "\n".join(
            f"{line.split('=')[0]}={chosen[line.split('=')[0]]}"
            if not line.startswith("#") and line.split("=")[0] in chosen
            else line
            for line in lines
        )
        + "\n"
    )
    clean_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("COMPOSE_", "TRIALQ_")) and k not in TEST_ENV
    }
    done = subprocess.run(
        [*compose, "-f", str(COMPOSE_FILE), "--project-directory", str(REPO_ROOT),
         "--env-file", str(env_file), "config", "--format", "json"],
        capture_output=True, text=True, timeout=60, env=clean_env, cwd=REPO_ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    worker = json.loads(done.stdout)["services"][WORKER]
    assert worker["image"] == "trialq-worker-jax:0.1.0"
    assert worker["build"]["dockerfile"] == "docker/worker-jax.Dockerfile"
    environment = worker["environment"]
    assert environment["TRIALQ_GPUS"] == "0,1"
    assert environment["TRIALQ_TRIALS_PER_GPU"] == "2"
    assert environment["TRIALQ_GPU_MEMORY_MB"] == "20000"
