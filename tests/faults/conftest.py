"""Fixtures of the fault suite: a nats-server of the test's own (tests restart it), daemon
clusters stopped at teardown, and the shared PostgreSQL's fresh per-test database."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from scheduler.daemon.embedded import NatsServer, Postgres
from tests.faults.harness import Cluster
from tests.faults.proxy import FaultProxy
from tests.support.compat import CURRENT, ClusterPostgres, NatsServerOf, Servers

StartCluster = Callable[..., Awaitable[Cluster]]


@pytest.fixture
def own_nats(servers: Servers, tmp_path: Path) -> Iterator[NatsServer]:
    server = NatsServerOf(tmp_path / "nats", servers.nats_binary).start()
    yield server
    server.stop()


class RestartablePostgres:
    """A pgserver PostgreSQL of the test's own in a data dir; stop() and start() keep its URL."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.pg = Postgres(data_dir).start()
        self.url = self.pg.url

    def stop(self) -> None:
        self.pg.stop()

    def start(self) -> None:
        self.pg = Postgres(self.data_dir).start()
        assert self.pg.url == self.url


@pytest.fixture
def own_pg(servers: Servers, tmp_path: Path) -> Iterator[RestartablePostgres | ClusterPostgres]:
    """Listed before `start_cluster` in a test, it outlives the daemons at teardown. In the
    compat run, a PostgreSQL 15 cluster made with that installation's initdb."""
    if servers is CURRENT:
        pg = RestartablePostgres(tmp_path / "pg")
        yield pg
        pg.stop()
        return
    if servers.pg_bindir is None:
        pytest.skip(servers.pg_bindir_skip or "no PostgreSQL installation")
    cluster = ClusterPostgres(servers.pg_bindir)
    yield cluster
    cluster.remove()


@pytest.fixture
async def proxies(own_nats: NatsServer) -> AsyncIterator[list[FaultProxy]]:
    """Two fault proxies in front of the test's nats-server, one per daemon."""
    made = [await FaultProxy("127.0.0.1", own_nats.port).start() for _ in range(2)]
    yield made
    for proxy in made:
        await proxy.close()


@pytest.fixture
async def start_cluster(tmp_path: Path) -> AsyncIterator[StartCluster]:
    """Start daemons (one per NATS URL given) on one database; all are stopped at teardown."""
    clusters: list[Cluster] = []

    async def start(
        nats_urls: list[str], database_url: str, schedules: str = "", **env: str
    ) -> Cluster:
        workdir = tmp_path / f"cluster{len(clusters)}"
        (workdir / "schedules").mkdir(parents=True)
        if schedules:
            (workdir / "schedules" / "jobs.yaml").write_text(schedules)
        cluster = Cluster(workdir, nats_urls, database_url, env)
        clusters.append(cluster)
        return await cluster.start()

    yield start
    for cluster in clusters:
        await cluster.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "faults" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.slow)
