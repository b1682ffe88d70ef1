"""The compose cluster of the repository, on a real Docker engine, for the compose tests.

One project of its own (name, ports, passwords, volumes), on the CPU override, so it never
meets a developer's own `docker compose up`. The driver runs as the README says,
`docker compose run --rm driver submit-study ...`, with the test's spec folder mounted.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import subprocess
import urllib.request
from base64 import b64encode
from collections import Counter
from pathlib import Path
from typing import Any

import optuna
from faults.harness import Verdict

from trialq.local import free_port

REPO_ROOT = Path(__file__).parents[2]
COMPOSE_FILES = ("compose.yaml", "compose.cpu.yaml")


def engine_answers() -> bool:
    """Whether a Docker engine with Compose v2 is there to use."""
    if shutil.which("docker") is None:
        return False
    for command in (["docker", "info"], ["docker", "compose", "version"]):
        if subprocess.run(command, capture_output=True, timeout=30).returncode != 0:
            return False
    return True


class Cluster:
    """`docker compose` on this test's project."""

    def __init__(self, folder: Path) -> None:
        self.project = f"trialq-test-{secrets.token_hex(3)}"
        self.passwords = {name: secrets.token_hex(16) for name in ("REDIS", "POSTGRES", "FLOWER")}
        self.ports = {
            name: free_port()
            for name in ("REDIS_HOST_PORT", "POSTGRES_HOST_PORT", "DASHBOARD_PORT", "FLOWER_PORT")
        }
        self.env_file = folder / "cluster.env"
        lines = [f"{name}_PASSWORD={value}" for name, value in self.passwords.items()]
        lines += [f"{name}={port}" for name, port in self.ports.items()]
        lines.append(f"RESULT_SECRET={secrets.token_hex(32)}")
        self.env_file.write_text("\n".join(lines) + "\n")

    def compose(
        self, *args: str, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        files = [arg for name in COMPOSE_FILES for arg in ("-f", str(REPO_ROOT / name))]
        command = [
            "docker", "compose", "-p", self.project, "--env-file", str(self.env_file), *files,
            *args,
        ]  # fmt: skip
        done = subprocess.run(
            command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
            env=_build_env(),
        )  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: rc {done.returncode}\n{done.stderr[-3000:]}")
        return done

    def start_driver(self, spec_folder: Path, *args: str) -> subprocess.Popen[str]:
        """`docker compose run --rm driver submit-study /study/study.toml ARGS` in the
        background (the README's command, with the spec folder mounted)."""
        files = [arg for name in COMPOSE_FILES for arg in ("-f", str(REPO_ROOT / name))]
        command = [
            "docker", "compose", "-p", self.project, "--env-file", str(self.env_file), *files,
            "run", "--rm", "--no-deps", "-v", f"{spec_folder}:/study:ro", "driver",
            "submit-study", "/study/study.toml", "--no-progress", "-v", *args,
        ]  # fmt: skip
        return subprocess.Popen(
            command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=_build_env(),
        )  # fmt: skip

    def containers_of(self, service: str | None = None) -> list[str]:
        """Running containers of the project (of one service), `run` containers included."""
        filters = ["--filter", f"label=com.docker.compose.project={self.project}"]
        if service is not None:
            filters += ["--filter", f"label=com.docker.compose.service={service}"]
        listed = subprocess.run(
            ["docker", "ps", "-q", *filters], capture_output=True, text=True, check=True
        )
        return listed.stdout.split()

    def remove_all_containers(self) -> None:
        if containers := self.containers_of():
            subprocess.run(["docker", "rm", "-f", *containers], capture_output=True)

    def container(self, service: str) -> str:
        return self.compose("ps", "-aq", service).stdout.strip().splitlines()[0]

    def services(self) -> dict[str, dict[str, Any]]:
        """`docker compose ps -a` by service: state, health, exit code."""
        out = self.compose("ps", "-a", "--format", "json").stdout
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        return {row["Service"]: row for row in rows}

    @property
    def storage_url(self) -> str:
        port = self.ports["POSTGRES_HOST_PORT"]
        return f"postgresql+psycopg2://trialq:{self.passwords['POSTGRES']}@127.0.0.1:{port}/optuna"

    @property
    def broker_url(self) -> str:
        return f"redis://:{self.passwords['REDIS']}@127.0.0.1:{self.ports['REDIS_HOST_PORT']}/0"

    def study(self, name: str) -> optuna.Study:
        return optuna.load_study(study_name=name, storage=self.storage_url)

    def http(self, service_port: str, path: str, login: tuple[str, str] | None = None) -> Any:
        """GET a JSON answer from the dashboard or Flower on the host's loopback."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.ports[service_port]}{path}")
        if login is not None:
            token = b64encode(f"{login[0]}:{login[1]}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read())

    def running_trials(self, study: str) -> int:
        try:
            trials = self.study(study).trials
        except Exception:  # not created yet, or the storage restarting
            return 0
        return sum(t.state is optuna.trial.TrialState.RUNNING for t in trials)

    def judge(self, fault: str, study: str, n_trials: int, driver_log: str) -> Verdict:
        """The fault's figures: from the storage, and from the driver's own log of its tells."""
        trials = self.study(study).trials
        finished = {t.number for t in trials if t.state.is_finished()}
        tells = Counter(re.findall(r"trial=(\d+) .*\| told ", driver_log))
        return Verdict(
            fault=fault,
            n_trials=n_trials,
            finished=len(finished),
            lost=len(set(range(n_trials)) - finished),
            told_twice=sum(count > 1 for count in tells.values()),
            left_running=sum(t.state is optuna.trial.TrialState.RUNNING for t in trials),
        )


def _build_env() -> dict[str, str]:
    """The builds use the classic builder: BuildKit would fetch a frontend from a registry."""
    import os

    return {**os.environ, "DOCKER_BUILDKIT": "0", "COMPOSE_DOCKER_CLI_BUILD": "0"}
