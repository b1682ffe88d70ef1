"""The fault suite's harness: run the real driver as a process, then judge the study.

Every fault ends with the same four figures: did the study reach n_trials, how many trials
were lost, how many told twice, how many left RUNNING. `LEDGER` collects them for the table
that `pytest tests/faults` prints at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import optuna
import psutil
import redis
from ledger import record
from optuna.trial import TrialState
from sqlalchemy.pool import NullPool
from waiting import wait_until

from trialq.local import LocalCluster

TESTS_DIR = Path(__file__).parents[1]

FAST_HEARTBEAT = {"TRIALQ_HEARTBEAT_INTERVAL_S": "0.5", "TRIALQ_HEARTBEAT_TTL_S": "3"}
"""Workers that beat often and are taken for lost within seconds."""


def fault_spec(
    entrypoint: str, space: str, n_trials: int, in_flight: int = 2, **trial_keys: object
) -> str:
    """The fault suite's study: grid sampling, two in flight (unless `in_flight` says),
    `[trial]` keys added as given."""
    extra = "\n".join(f"{key} = {json.dumps(value)}" for key, value in trial_keys.items())
    return f"""
        [study]
        name = "faults"
        n_trials = {n_trials}
        max_in_flight = {in_flight}
        sampler = "grid"
        pruner = "none"
        [trial]
        entrypoint = "trials:{entrypoint}"
        timeout_s = 60
        {extra}
        {space}
        """


def grid(name: str, *choices: object) -> str:
    """A categorical `[space.NAME]` table: the grid sampler runs each choice once."""
    values = ", ".join(repr(c).replace("'", '"') for c in choices)
    return f'[space.{name}]\ntype = "categorical"\nchoices = [{values}]'


@dataclass(frozen=True)
class Verdict:
    """One fault's figures."""

    fault: str
    n_trials: int
    finished: int
    lost: int
    told_twice: int
    left_running: int
    outcomes: dict[str, int] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """The bar every fault must clear."""
        return (
            self.finished == self.n_trials
            and self.lost == 0
            and self.told_twice == 0
            and self.left_running == 0
        )


def record_verdict(verdict: Verdict) -> Verdict:
    """Add a fault's row to the table printed after the run (tests/ledger.py)."""
    record("faults", asdict(verdict))
    return verdict


def assert_clean(verdict: Verdict) -> None:
    assert verdict.passed, verdict


@dataclass
class DriverRun:
    """A study folder with its spec, and the way to run the counting driver on it."""

    folder: Path
    broker_url: str
    study_name: str = "faults"
    storage_url: str | None = None
    """Where the study lives; a SQLite file in `folder` unless given."""
    env: dict[str, str] = field(default_factory=dict)
    """The driver's environment beyond the tests' (a result secret, say)."""

    @property
    def tell_log(self) -> Path:
        return self.folder / "tells.log"

    @property
    def storage(self) -> str:
        return self.storage_url or f"sqlite:///{self.folder / 'faults.db'}"

    def write_spec(self, body: str) -> Path:
        spec = self.folder / "study.toml"
        spec.write_text(textwrap.dedent(body))
        return spec

    def start(self, *extra: str) -> subprocess.Popen[str]:
        """Start `submit-study` (counting tells) against the test broker."""
        env = {
            **os.environ,
            **self.env,
            "TRIALQ_TEST_TELL_LOG": str(self.tell_log),
            "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
        }
        command = [
            sys.executable, "-m", "faults.counting_driver", str(self.folder / "study.toml"),
            "--broker", self.broker_url, "--storage", self.storage, "--no-progress", *extra,
        ]  # fmt: skip
        return subprocess.Popen(
            command, env=env, cwd=self.folder, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_ctrl_c_as_in_a_shell,
        )  # fmt: skip

    def run(self, *extra: str, timeout: float = 300) -> tuple[int, str]:
        """Run the driver to its end; return its exit code and stderr."""
        process = self.start(*extra)
        _, err = process.communicate(timeout=timeout)
        return process.returncode, err

    def study(self) -> optuna.Study:
        """The study; KeyError before the driver has made it. A SQLite file is looked at
        read-only first: Optuna's storage, opened while the driver creates the database,
        writes the schema too, and the two race (UNIQUE constraint failed: alembic_version)."""
        if self.storage.startswith("sqlite:///") and not _sqlite_holds(
            Path(self.storage.removeprefix("sqlite:///")), self.study_name
        ):
            raise KeyError(self.study_name)
        # No pool: a test polls this many times a second, and each pooled engine kept its
        # connection open until collected (60 of them filled the hosts' PostgreSQL).
        storage = optuna.storages.RDBStorage(self.storage, engine_kwargs={"poolclass": NullPool})
        return optuna.load_study(study_name=self.study_name, storage=storage)

    def judge(self, fault: str, n_trials: int) -> Verdict:
        """Figure out the verdict from the storage and the tell log, and record it."""
        trials = self.study().trials
        tells = Counter(self.tell_log.read_text().split()) if self.tell_log.exists() else {}
        finished = [t for t in trials if t.state.is_finished()]
        numbers = {t.number for t in finished}
        verdict = Verdict(
            fault=fault,
            n_trials=n_trials,
            finished=len(finished),
            lost=len(set(range(n_trials)) - numbers),
            told_twice=sum(count > 1 for count in tells.values()),
            left_running=sum(t.state is TrialState.RUNNING for t in trials),
            outcomes=dict(Counter(str(t.user_attrs.get("outcome")) for t in finished)),
        )
        return record_verdict(verdict)


def _ctrl_c_as_in_a_shell() -> None:
    """The driver takes SIGINT as Ctrl-C in a terminal does: a test run started in the
    background (`pytest ... &`) has it ignored, and a child inherits that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def delete_study(run: DriverRun) -> None:
    """Remove the run's study, where there is one (a killed earlier run may have left it)."""
    with contextlib.suppress(KeyError):
        optuna.delete_study(study_name=run.study_name, storage=run.storage)


def finished_count(run: DriverRun) -> int:
    """How many of the study's trials are finished (0 before the study exists)."""
    try:
        return sum(t.state.is_finished() for t in run.study().trials)
    except KeyError:
        return 0


def worker_parent_running_a_trial(cluster: LocalCluster) -> psutil.Process:
    """The main process of the worker whose child has STARTED a trial (Celery's own meta)."""
    return trial_process_started(cluster.broker_url).parent()


def trial_process_started(broker_url: str) -> psutil.Process:
    """The trial process that has STARTED a trial (Celery's own meta), waited for."""
    client = redis.Redis.from_url(broker_url)

    def started_pid() -> int | None:
        for key in client.scan_iter(match="celery-task-meta-*"):
            meta = json.loads(client.get(key) or b"{}")
            if meta.get("status") == "STARTED":
                return int(meta["result"]["pid"])
        return None

    return psutil.Process(wait_until(started_pid, 60, "a worker to start a trial"))


def _sqlite_holds(path: Path, study_name: str) -> bool:
    """Whether the SQLite file holds the study, read without writing anything."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path.resolve()}?mode=ro", uri=True)) as db:
            found = db.execute("SELECT 1 FROM studies WHERE study_name = ?", (study_name,))
            return found.fetchone() is not None
    except sqlite3.Error:  # no file or no tables yet
        return False
