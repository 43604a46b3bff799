"""Real-service test harness: nats-server and PostgreSQL started once per session on free ports.

`NATS_URL` / `DATABASE_URL` point the suite at servers you already run instead. Each test gets
a fresh database cloned from a migrated template and a JetStream namespace emptied after it; the
teardown checks that the test closed every connection it opened.

Under pytest-xdist (`-n 2`) each worker is a process of its own, so each starts its own
servers (these fixtures are session-scoped) and the per-test cleanup and leak checks, which
count a whole server, see only that worker's tests; `NATS_URL` is refused there, as every
worker's teardown would delete the others' streams (`DATABASE_URL` is fine: databases are per test).

Every test on these fixtures runs on the suite's current servers (`[current]`); where a server
version can change the answer (COMPAT_RUN below, the contract suites, the tests marked `smoke`)
it runs again on production's versions, `[compat]` (marker `compat`: nats-server 2.10 and
PostgreSQL 15, see tests/support/compat.py); `-m "not compat"` runs the first only.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import shutil
import tempfile
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import nats
import nats.aio.client
import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from nats.js.errors import NotFoundError

from scheduler.daemon import migrate
from scheduler.daemon.embedded import free_port
from scheduler.settings import Settings
from tests.support.cluster import ClusterError, NatsCluster, wait_placeable
from tests.support.compat import CURRENT, NatsServerOf, Servers, compat_servers, session_postgres

# Hypothesis's own timing checks are off for the whole suite: its 200 ms default deadline per
# example and its "input generation is slow" health check time the host, not the code under
# test, and on a loaded 2-core host they failed a pure property (tests/unit/test_deadletter.py:
# one draw of a header dict took 1.8 s while three workers and their servers ran). A test that
# means a bound on time sets its own `deadline`.
hypothesis_settings.register_profile(
    "suite", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
# Locally hypothesis explores new cases on every run; CI replays a fixed set so a rare
# counterexample shows up in a developer's run rather than turning a landing red at random.
hypothesis_settings.register_profile(
    "ci", parent=hypothesis_settings.get_profile("suite"), derandomize=True
)
hypothesis_settings.load_profile("ci" if os.environ.get("CI") else "suite")


# Tests between two full collections of this process (see `_collect_like_the_daemon`).
FULL_COLLECTION_EVERY = 50
_tests_since_full = [0]


@pytest.fixture(autouse=True)
def _collect_like_the_daemon() -> None:
    """The daemons under test run in this process, beside every earlier test's objects: a
    full collection over them stalled their loops 0.3-0.65 s in the middle of a test (a
    refusal timed at 0.48 s against 0.4 failed on it). As `scheduler run` does once it is up
    (`scheduler.daemon.runstate.tune_gc`), what exists before a test is frozen out of the
    collections it runs; every FULL_COLLECTION_EVERY tests, between two tests, one full
    collection frees what the earlier ones left."""
    _tests_since_full[0] += 1
    if _tests_since_full[0] >= FULL_COLLECTION_EVERY:
        _tests_since_full[0] = 0
        gc.unfreeze()
        gc.collect()
    gc.freeze()


def pytest_configure(config: pytest.Config) -> None:
    """A shared NATS_URL cannot serve parallel workers: refuse it before any test runs."""
    config.pluginmanager.register(_LoadGroupIds(), "mq-scheduler-loadgroup-ids")
    if os.environ.get("NATS_URL") and config.getoption("numprocesses", None):
        raise pytest.UsageError(
            "NATS_URL is set, but with -n every pytest-xdist worker's teardown would delete "
            "the other workers' streams on that server: unset NATS_URL (each worker then "
            "starts a nats-server of its own) or run without -n"
        )


TESTS = Path(__file__).parent
# The server-backed modules that run again on production's server versions (`[compat]`), and
# why the version can change their answer. Besides them: every contract suite (tests/contracts,
# the ports' contracts on the real bus and store) and the end-to-end path (tests marked
# `smoke`: delayed delivery, dead letter, cron, a request verb, HTTP). The rest of the
# server-backed tests exercise the daemon's own logic above those ports: a second run on other
# versions would repeat it (docs/development.md, "Server versions").
COMPAT_RUN: dict[str, str] = {
    "faults/test_faults.py": "the fault suite: how each server fails, restarts and recovers",
    "integration/test_wire.py": "the raw protocol frames the publisher writes",
    "integration/test_publish_resend.py": "JetStream's 503 while a stream has no leader",
    "integration/test_lane_recovery.py": "consumer info and direct reads by sequence",
    "integration/test_lane_dedup.py": "the stream's duplicate window",
    "integration/test_nats_bus.py": "streams, consumers and buckets as provisioned",
    "integration/test_replicas.py": "provisioning replicas and reading them back",
    "integration/test_least_privilege.py": "the permissions each account is granted",
    "integration/test_nats_auth.py": "the server's authentication and authorization",
    "integration/test_leader.py": "the KV lease: create, revision-checked update, expiry",
    "integration/test_migrations.py": "the schema's DDL",
    "integration/test_edge_bounds_migration.py": "a migration over existing rows",
    "integration/test_compat_postgres.py": "PostgreSQL 15's own refusals",
    "integration/test_backup_restore.py": "pg_dump and restore of the schema",
    "integration/test_task_store.py": "the store's SQL and its plans",
    "integration/test_idempotency_store.py": "the store's SQL",
    "integration/test_poison_rows.py": "what jsonb and text columns accept",
    "integration/test_schedule_history.py": "the store's SQL",
    "integration/test_activity_log.py": "the store's SQL",
    "integration/test_audit_pruning.py": "partition upkeep in SQL",
}


def _runs_on_compat(metafunc: pytest.Metafunc) -> bool:
    where = metafunc.definition.path.relative_to(TESTS).as_posix()
    return where in COMPAT_RUN or metafunc.definition.get_closest_marker("smoke") is not None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test on the session's servers runs on `current`, and on `compat` too where the
    version can change its answer (COMPAT_RUN). The contract suites parametrize `servers`
    themselves (tests/contracts/conftest.py: `memory`, `current`, `compat`)."""
    if "servers" not in metafunc.fixturenames or metafunc.definition.path.is_relative_to(
        TESTS / "contracts"
    ):
        return
    runs = ["current", "compat"] if _runs_on_compat(metafunc) else ["current"]
    metafunc.parametrize("servers", runs, indirect=True, scope="session")


@pytest.fixture(scope="session")
def servers(request: pytest.FixtureRequest) -> Servers:
    """The suite's own servers, or production's versions (nats-server 2.10, PostgreSQL 15):
    parametrized by `pytest_generate_tests`."""
    return CURRENT if getattr(request, "param", "current") == "current" else compat_servers()


@pytest.fixture(scope="session")
def nats_service(
    servers: Servers, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int | None]]:
    """(client URL, monitoring port or None) of the session's nats-server."""
    if servers is CURRENT and os.environ.get("NATS_URL"):
        yield os.environ["NATS_URL"], None
        return
    monitor = free_port()
    store = tmp_path_factory.mktemp("nats")
    server = NatsServerOf(store, servers.nats_binary, extra=["-m", str(monitor)]).start()
    yield server.url, monitor
    server.stop()


@pytest.fixture(scope="session")
def pg_admin_dsn(servers: Servers, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A DSN with the right to create databases, on the session's PostgreSQL (never the
    machine's own: tests/support/compat.py)."""
    # Outside pytest's own temp root: every pytest session that starts resets that root to
    # 0700, which locks out pgserver's system user (two sessions at once lost their server).
    data = Path(tempfile.mkdtemp(prefix="mq-scheduler-test-pg-"))
    try:
        with session_postgres(servers, data) as dsn:
            yield dsn
    finally:
        shutil.rmtree(data, ignore_errors=True)


def _dsn_for(admin_dsn: str, database: str) -> str:
    base, _, query = admin_dsn.partition("?")
    head, _, _old = base.rpartition("/")
    return f"{head}/{database}" + (f"?{query}" if query else "")


@pytest.fixture(scope="session")
def pg_template(pg_admin_dsn: str) -> Iterator[str]:
    """The name of a database migrated to head, cloned for every test; dropped at the end (the
    server may be one the suite does not own)."""
    name = f"mqs_tpl_{uuid.uuid4().hex[:8]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(pg_admin_dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    try:
        migrate.upgrade(_dsn_for(pg_admin_dsn, name))
        yield name
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
async def database_url(pg_admin_dsn: str, pg_template: str) -> AsyncIterator[str]:
    """A fresh migrated database for this test; dropped afterwards, checking nothing leaked."""
    name = f"mqs_t_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(pg_admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template}"')
        yield _dsn_for(pg_admin_dsn, name)
        leaked = await _wait_no_connections(admin, name)
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await admin.close()
    assert leaked == 0, f"test left {leaked} PostgreSQL connection(s) open"


async def _wait_no_connections(admin: asyncpg.Connection, name: str) -> int:
    count = 0
    for _ in range(60):
        count = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1", name
        )
        if count == 0:
            break
        await asyncio.sleep(0.05)
    return int(count)


@pytest.fixture
async def nats_url(nats_service: tuple[str, int | None]) -> AsyncIterator[str]:
    """The session's NATS; every stream is deleted after the test and leaked clients are caught."""
    url, monitor = nats_service
    yield url
    nc = await nats.connect(url)
    js = nc.jetstream()
    for info in await js.streams_info():
        assert info.config.name is not None
        await js.delete_stream(info.config.name)
    await nc.close()
    if monitor is not None:
        known = _leaked_before.get(monitor, 0)
        count = await _wait_clients_down_to(monitor, known)
        _leaked_before[monitor] = max(known, count)
        assert count <= known, f"test left {count - known} NATS connection(s) open"


# Connections an earlier test left open on a session's server (by monitoring port): each
# leak fails the test that made it, not every test after it as well.
_leaked_before: dict[int, int] = {}


async def _wait_clients_down_to(monitor: int, known: int) -> int:
    count = 0
    for _ in range(60):
        raw = await asyncio.to_thread(_http_get, f"http://127.0.0.1:{monitor}/connz")
        count = int(json.loads(raw)["num_connections"])
        if count <= known:
            break
        await asyncio.sleep(0.05)
    return count


def _http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return bytes(resp.read())


@pytest.fixture
def settings(nats_url: str, database_url: str, tmp_path: Path) -> Settings:
    """Settings pointing at this test's NATS and database, with ports picked by the OS."""
    (tmp_path / "schedules").mkdir()
    return Settings(
        schedules_dir=tmp_path / "schedules",
        nats_url=nats_url,
        database_url=database_url,
        http_port=0,
        metrics_port=0,
        data_dir=tmp_path / "data",
        instance_id="test-1",
        lease_ttl=3,
    )


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by these markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/integration and tests/faults talks to real servers; the runs on
    production's server versions carry `compat`; the Spark tests share one xdist group. Marked
    before `-m` is applied: marked after it (as this hook once was, to run after xdist's own),
    `-m "not integration"` and `-m "not compat"` selected every test."""
    for item in items:
        parts = Path(str(item.fspath)).parts
        if "integration" in parts or "faults" in parts:
            item.add_marker(pytest.mark.integration)
        if "spark" in parts:
            item.add_marker(pytest.mark.xdist_group("spark"))
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("servers") == "compat":
            item.add_marker(pytest.mark.compat)


class _LoadGroupIds:
    """The Spark tests share one xdist worker (one JVM instead of one per worker) under
    `--dist loadgroup`: their ids get the group's suffix after xdist's own hook (a plugin of
    its own, since this hook must run last and the conftest's first)."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        if getattr(config.option, "loadgroup", False):
            for item in items:
                _xdist_group(item)


def _xdist_group(item: pytest.Item) -> None:
    """What `--dist loadgroup` needs on pytest 9: xdist 3.8 sends every test of one
    `xdist_group` to one worker by appending `@group` to its node id, but writes
    `item._nodeid`, which pytest 9 no longer reads (the id lives in `item._id`), so the groups
    were silently spread over every worker. The suffix is put where pytest 9 keeps the id; an
    id xdist did suffix is left alone."""
    from _pytest.nodeid import NodeId

    names = sorted(
        {str(m.args[0] if m.args else m.kwargs.get("name", "default"))
         for m in item.iter_markers("xdist_group")}
    )  # fmt: skip
    suffix = "@" + "_".join(names)
    if names and not item.nodeid.endswith(suffix):
        item._id = NodeId.parse(item.nodeid + suffix)


@pytest.fixture(scope="session")
def nats_cluster_service() -> Iterator[NatsCluster]:
    """A 3-node JetStream cluster of the session's own (tests/support/cluster.py), on the
    suite's current nats-server only: ~3 s to form, once."""
    cluster = NatsCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture
async def nats_cluster(nats_cluster_service: NatsCluster) -> AsyncIterator[NatsCluster]:
    """The session's cluster with every node up and placing replicated streams; afterwards a
    node the test killed or froze is brought back and every stream is deleted."""
    cluster = nats_cluster_service
    nc = await nats.connect(cluster.urls)
    try:
        await wait_placeable(nc)
    finally:
        await nc.close()
    yield cluster
    await asyncio.to_thread(cluster.heal)
    nc = await nats.connect(cluster.urls)
    try:
        await asyncio.wait_for(_delete_every_stream(nc, cluster), 120)
    finally:
        await nc.close()


async def _delete_every_stream(nc: nats.aio.client.Client, cluster: NatsCluster) -> None:
    """Delete every stream and wait until no node holds one. Names come from
    `$JS.API.STREAM.NAMES` (the meta group's list): `STREAM.LIST` waits 4 s for the leaders of
    streams that are moving to new peers and then leaves them out."""
    js = nc.jetstream(timeout=10)
    while True:
        reply = await nc.request("$JS.API.STREAM.NAMES", b"{}", timeout=10)
        names = json.loads(reply.data).get("streams") or []
        if not names:
            break
        for name in names:
            # A replica catching up after a fault took over 15 s on a loaded 2-core host, and
            # twice in full runs one never did within 30 s (an idle MQ_DLQ after a SIGSTOP, an
            # MQ_TASKS after the replicas test): a stream is waited for 10 s and then deleted as
            # it is (a delete is the meta group's, no stream leader needed); a node that still
            # holds it afterwards is restarted (`wait_streams_gone`).
            try:
                await asyncio.to_thread(cluster.replicas_current, name, 10.0)
            except ClusterError:
                print(f"teardown: {name}'s replicas are not current after 10 s; deleting it")
            with contextlib.suppress(NotFoundError):
                await js.delete_stream(name)
    await asyncio.to_thread(cluster.wait_streams_gone, 30.0)
    await asyncio.to_thread(cluster.wait_healthy)
