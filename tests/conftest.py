"""Shared fixtures: the machine's real Redis (one dedicated database), its real PostgreSQL,
and real workers; each pytest-xdist worker has databases of its own (tests/services.py)."""

from __future__ import annotations

import contextlib
import os
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import ledger
import pytest
import redis
import sqlalchemy
from services import POSTGRES_SERVER_URL, POSTGRES_URL, TEST_REDIS_URL, WORKER, create_database_once
from tiers import in_fast_tier

from trialq.local import LocalCluster

TESTS_DIR = Path(__file__).parent

TEST_RESULT_SECRET = "the-test-suite-result-secret-0123456789"
"""The deployment secret of every test: the workers `start_workers` starts hold it, and every
driver and worker a test starts finds it in its environment, so that their tasks and results
verify (a test of another secret, or of none, sets its own)."""


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A clean, dedicated Redis database; skipped locally, failed in CI, if Redis is away."""
    client = redis.Redis.from_url(TEST_REDIS_URL, socket_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"Redis at {TEST_REDIS_URL} is required in CI: {exc}")
        pytest.skip(f"Redis at {TEST_REDIS_URL} is not answering: {exc}")
    client.flushdb()
    yield TEST_REDIS_URL
    client.flushdb()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The machine's PostgreSQL (this xdist worker's own database on it, created once);
    skipped locally, failed in CI, if it is not answering."""
    try:
        if WORKER is not None:
            create_database_once(POSTGRES_URL, via=POSTGRES_SERVER_URL)
        engine = sqlalchemy.create_engine(POSTGRES_URL)
        engine.connect().close()
        engine.dispose()
    except sqlalchemy.exc.OperationalError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL at {POSTGRES_URL} is required in CI: {exc}")
        pytest.skip(f"PostgreSQL is not answering: {exc}")
    return POSTGRES_URL


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A study storage on each backend: a SQLite file in tmp_path, then this process's
    PostgreSQL database (tests name their studies apart there and delete them)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'study.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def start_workers(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """Start N real `trialq worker` processes on the test database; stopped afterwards. Their
    logs are kept in the test's folder (`workers-N/`), to read after a failure."""
    clusters: list[LocalCluster] = []

    def start(
        count: int = 2,
        queue: str = "gpu",
        extra_env: dict[str, str] | None = None,
        broker_url: str | None = None,
    ) -> LocalCluster:
        env = {"PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")])}
        # `auto` preloads PyTorch and JAX where several frameworks are installed (8 s and
        # 400 MB a worker here): a test that wants a preload names it.
        env["TRIALQ_PRELOAD"] = "none"
        cluster = LocalCluster(
            count,
            queue,
            allowed_modules=("trials", "trialq.examples"),
            extra_env={**env, **(extra_env or {})},
            broker_url=broker_url or redis_url,
            log_dir=tmp_path / f"workers-{len(clusters)}",
            result_secret=TEST_RESULT_SECRET,
        )
        clusters.append(cluster.__enter__())
        return cluster

    yield start
    for cluster in clusters:
        cluster.stop()


@pytest.fixture
def write_spec(tmp_path: Path) -> Callable[..., Path]:
    """Write a spec file into tmp_path from TOML text (dedented)."""

    def write(text: str, name: str = "study.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


SERIAL_GROUPS = {
    "compose": "one compose cluster per module, its tests in file order",
    "gpu": "one GPU: its memory readings are the machine's, not one test's",
}
"""Markers whose tests run one after another on one pytest-xdist worker (`--dist loadgroup`)."""


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the node ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for marker in SERIAL_GROUPS:
            if item.get_closest_marker(marker):
                item.add_marker(pytest.mark.xdist_group(marker))
        if _in_fast_tier(item):
            item.add_marker(pytest.mark.unit)


def _in_fast_tier(item: pytest.Item) -> bool:
    """`tiers.in_fast_tier` for a collected test."""
    callspec = getattr(item, "callspec", None)
    return in_fast_tier(
        item.path,
        getattr(item, "fixturenames", ()),
        callspec.params if callspec is not None else {},
        slow=item.get_closest_marker("slow") is not None,
    )


@pytest.fixture(autouse=True)
def _isolated_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """No TRIALQ_* variable of the developer's shell leaks into a test; the suite's secret is
    in every test's environment (`TEST_RESULT_SECRET`)."""
    for name in list(os.environ):
        if name.startswith("TRIALQ_") and name != "TRIALQ_TEST_REDIS_URL":
            monkeypatch.delenv(name)
    monkeypatch.setenv("TRIALQ_RESULT_SECRET", TEST_RESULT_SECRET)


# --- the fault and compose tables, printed where the run ends (tests/ledger.py) ------------


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    if call.when == "teardown":  # after the module fixtures' teardown too
        ledger.attach(item)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        ledger.collect(report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    ledger.summarize(terminalreporter.write_line)


JAX_BRIDGE = "jax._src.xla_bridge"
"""Where JAX keeps whether its backends started (`trialq.trial.frameworks.jax`)."""


@contextlib.contextmanager
def no_framework_started_here() -> Iterator[None]:
    """Hide, for the block, a JAX that another test started in this same test process (xdist
    runs many files in one): the fork guard would read it as a device in use and refuse to
    fork the pool's processes. Tests of the guard itself run JAX in processes of their own."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delitem(sys.modules, JAX_BRIDGE, raising=False)
        yield


@pytest.fixture
def no_framework_here() -> Iterator[None]:
    """`no_framework_started_here` for one test."""
    with no_framework_started_here():
        yield
