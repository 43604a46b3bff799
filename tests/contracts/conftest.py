"""Contract suites: the same tests over an in-memory twin and the real backend.

Every test here asks for `backend`: `memory` (no server), `current` and `compat` (the real
PostgreSQL or nats-server of tests/conftest.py, marked `external_service`; the compat run also
carries `compat`). `servers` is overridden so that it also takes the `memory` value: the real
fixtures (`database_url`, `nats_url`) are then requested only by the real runs.

The bus's suites (BUS_SUITES) run their `current` tests twice: on the session's single
nats-server and on its 3-node cluster (tests/conftest.py's `nats_cluster`, streams and buckets at
3 replicas, the client on one node while a stream's leader may be on another): `topology`.
"""

from __future__ import annotations

import pytest

from tests.support.compat import CURRENT, Servers, compat_servers

_REAL = [pytest.mark.external_service, pytest.mark.integration]
# the suites of the bus's ports, run on the cluster as well (production's topology)
BUS_SUITES = {"test_bus.py", "test_bus_writer.py", "test_broker.py", "test_office.py"}


@pytest.fixture(
    scope="session",
    params=["memory", pytest.param("current", marks=_REAL), pytest.param("compat", marks=_REAL)],
)
def servers(request: pytest.FixtureRequest) -> Servers | None:
    """None for the twin's run, else the servers of tests/conftest.py's `servers`."""
    if request.param == "memory":
        return None
    return CURRENT if request.param == "current" else compat_servers()


@pytest.fixture
def backend(servers: Servers | None) -> str:
    return "memory" if servers is None else "real"


@pytest.fixture
def database(backend: str, request: pytest.FixtureRequest) -> str | None:
    """A fresh migrated database's URL for the real run (tests/conftest.py), None for the twin.
    Requested from a plain fixture: the real ones start servers outside the event loop."""
    return None if backend == "memory" else str(request.getfixturevalue("database_url"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A bus suite's test that talks to a nats-server runs on one server and on the cluster."""
    if metafunc.definition.path.name in BUS_SUITES and "nats_server_url" in metafunc.fixturenames:
        metafunc.parametrize("topology", ["single", "cluster"])


@pytest.fixture
def topology() -> str:
    """`single` (one nats-server) or `cluster` (three): see the module's docstring."""
    return "single"


@pytest.fixture
def replicas(topology: str) -> int:
    """The replicas a test's own streams and buckets get: 3 on the cluster, as in production."""
    return 3 if topology == "cluster" else 1


@pytest.fixture
def nats_server_url(backend: str, topology: str, request: pytest.FixtureRequest) -> str | None:
    """The URL of the session's nats-server for the real run (on the cluster, one node's: the
    client learns the others from it), None for the twin."""
    if backend == "memory":
        return None
    if topology == "cluster":
        return str(request.getfixturevalue("nats_cluster").urls[0])
    return str(request.getfixturevalue("nats_url"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test run over several implementations of a port (an `adapter` parameter: `twin` or a
    real adapter) is kept only where the twin meets the memory run and an adapter a real one;
    the cluster's run only with the suite's current servers (one cluster, of that version)."""
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        params = getattr(item, "callspec", None)
        adapter = params.params.get("adapter") if params is not None else None
        memory = params is not None and params.params.get("servers") == "memory"
        cluster = params is not None and params.params.get("topology") == "cluster"
        twin_mismatch = adapter is not None and (adapter == "twin") != memory
        off_cluster = cluster and params is not None and params.params.get("servers") != "current"
        (drop if twin_mismatch or off_cluster else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
