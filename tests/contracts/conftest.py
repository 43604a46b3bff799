"""Contract suites: the same tests over an in-memory twin and the real backend.

Every test here asks for `backend`: `memory` (no server), `current` and `compat` (the real
PostgreSQL or nats-server of tests/conftest.py, marked `external_service`; the compat run also
carries `compat`). `servers` is overridden so that it also takes the `memory` value: the real
fixtures (`database_url`, `nats_url`) are then requested only by the real runs.
"""

from __future__ import annotations

import pytest

from tests.support.compat import CURRENT, Servers, compat_servers

_REAL = [pytest.mark.external_service, pytest.mark.integration]


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


@pytest.fixture
def nats_server_url(backend: str, request: pytest.FixtureRequest) -> str | None:
    """The URL of the session's nats-server for the real run, None for the twin."""
    return None if backend == "memory" else str(request.getfixturevalue("nats_url"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test run over several implementations of a port (an `adapter` parameter: `twin` or a
    real adapter) is kept only where the twin meets the memory run and an adapter a real one."""
    keep, drop = [], []
    for item in items:
        params = getattr(item, "callspec", None)
        adapter = params.params.get("adapter") if params is not None else None
        memory = params is not None and params.params.get("servers") == "memory"
        (drop if adapter is not None and (adapter == "twin") != memory else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
