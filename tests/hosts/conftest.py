"""The hosts: one switch; Redis, PostgreSQL, the driver and two worker hosts, each a network
namespace of its own (tests/hosts/netns.py). Made once for the module, set back to healthy
and emptied for each test; removed at the end whatever happened.

Where namespaces cannot be made (not root, no `ip`, no iptables) the tests skip with the
reason; under CI=true they fail instead when `ip netns add` itself works, so CI on a machine
that can make hosts never skips them silently.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from hosts.cluster import HostDriverRun, HostWorkers, PostgresHost, RedisHost, postgres_binaries
from hosts.netns import Host, Network, netns_add_works, unavailable

FAST_HEARTBEAT = {"TRIALQ_HEARTBEAT_INTERVAL_S": "0.5", "TRIALQ_HEARTBEAT_TTL_S": "3"}
"""tests/faults/harness.py's: workers beat often and are taken for lost within seconds."""
HEARTBEAT_TTL_S = float(FAST_HEARTBEAT["TRIALQ_HEARTBEAT_TTL_S"])


def _skip_or_fail(reason: str) -> None:
    if os.environ.get("CI") == "true" and netns_add_works():
        pytest.fail(f"hosts tests cannot run although `ip netns add` works, in CI: {reason}")
    pytest.skip(f"no test hosts here: {reason}")


@dataclass
class Hosts:
    """The module's hosts and services, and what one test started on them."""

    network: Network
    redis: RedisHost
    postgres: PostgresHost
    folder: Path
    workers: list[HostWorkers] = field(default_factory=list)

    def host(self, role: str) -> Host:
        return self.network.hosts[role]

    @property
    def client(self) -> redis.Redis:
        return self.redis.client

    def start_workers(self, role: str, count: int = 1) -> HostWorkers:
        """`count` worker processes on host `role`, with the fast heartbeat; waited for
        (`LocalCluster` waits for its own, by name: another host's already beat)."""
        workers = HostWorkers(self.host(role), self.redis.url, self.folder / role, count,
                              FAST_HEARTBEAT)  # fmt: skip
        self.workers.append(workers)
        workers.__enter__()
        return workers

    def driver_run(self) -> HostDriverRun:
        """A driver on the driver's host, its study in a new database on the PostgreSQL host."""
        return HostDriverRun(self.folder, self.redis.url, storage_url=self.postgres.new_database(),
                             host=self.host("driver"))  # fmt: skip


@pytest.fixture(scope="module")
def module_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hosts]:
    reason = unavailable()
    binaries = postgres_binaries()
    if reason is None and binaries is None:
        reason = "no PostgreSQL server installed (/usr/lib/postgresql/*/bin/initdb)"
    if reason is not None:
        _skip_or_fail(reason)
    assert binaries is not None
    folder = tmp_path_factory.mktemp("hosts")
    with Network.made() as network:
        redis_host = RedisHost(network.add_host("redis", 2), folder)
        postgres = PostgresHost(network.add_host("postgres", 3), binaries)
        network.add_host("driver", 10)
        network.add_host("w1", 11)
        network.add_host("w2", 12)
        try:
            redis_host.start()
            postgres.start()
            yield Hosts(network, redis_host, postgres, folder)
        finally:
            redis_host.stop()
            postgres.stop()


@pytest.fixture
def hosts(module_hosts: Hosts, tmp_path: Path) -> Iterator[Hosts]:
    """The hosts, healthy and empty, for one test; healed and its workers stopped after."""
    hosts = Hosts(module_hosts.network, module_hosts.redis, module_hosts.postgres, tmp_path)
    hosts.client.flushall()
    try:
        yield hosts
    finally:
        hosts.network.heal_all()
        with contextlib.suppress(RuntimeError):  # a delay queue that died: the test said so
            hosts.network.restore()
        for workers in hosts.workers:
            workers.stop()
        for role in ("w1", "w2", "driver"):  # whatever a test left running there
            hosts.host(role).kill_all()
        if not hosts.redis.running():
            hosts.redis.start()
