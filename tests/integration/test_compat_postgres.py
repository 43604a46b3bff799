"""The compat run's PostgreSQL 15 is a cluster of the suite's own, never the machine's server."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import asyncpg
import pytest

from tests.support import compat
from tests.support.compat import Servers, session_postgres

pytestmark = pytest.mark.compat


def test_compat_postgres_is_our_own_15_on_a_free_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without SCHEDULER_COMPAT_DATABASE_URL the session's compat PostgreSQL is a 15.x cluster
    on a free loopback port (not 5432), and nothing listens there once the session ends."""
    monkeypatch.delenv("SCHEDULER_COMPAT_DATABASE_URL", raising=False)
    bindir, why = compat._pg_bindir()
    if bindir is None:
        pytest.skip(str(why))
    servers = Servers("compat", pg_bindir=bindir)
    with session_postgres(servers, tmp_path) as dsn:
        port = int(dsn.rsplit(":", 1)[1].split("/")[0])
        assert port != 5432
        version, data_dir = asyncio.run(_ask(dsn))
        assert version // 10000 == 15 and "mqs-pg-" in data_dir
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0


async def _ask(dsn: str) -> tuple[int, str]:
    conn = await asyncpg.connect(dsn)
    try:
        version = int(await conn.fetchval("SHOW server_version_num"))
        return version, str(await conn.fetchval("SHOW data_directory"))
    finally:
        await conn.close()


def test_without_postgresql_15_the_reason_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no PostgreSQL 15 can be had, the compat tests are skipped with one line naming
    the folder and the variable to set."""
    monkeypatch.setenv("SCHEDULER_COMPAT_PG_BINDIR", "/nonexistent/bin")
    bindir, why = compat._pg_bindir()
    assert bindir is None and why is not None and "\n" not in why
    assert "/nonexistent/bin" in why and "SCHEDULER_COMPAT_PG_BINDIR" in why
