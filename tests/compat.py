"""The servers the suite runs against: its own (`current`) and what production runs (`compat`).

Every test that uses the server fixtures runs twice: `[current]` on the suite's own servers (the
venv's nats-server, PostgreSQL from `pgserver`) and `[compat]` (marker `compat`) on production's
versions: nats-server 2.10 (installed beside the venv by `tests.tools`) and PostgreSQL 15.

- NATS: `SCHEDULER_COMPAT_NATS_SERVER` names another binary; by default the 2.10 release.
- PostgreSQL for the shared fixtures: the server at `SCHEDULER_COMPAT_DATABASE_URL` (default the
  machine's own, `postgresql://postgres@127.0.0.1:5432/postgres`), which must be 15.x and allow
  CREATE DATABASE; the suite creates its databases there and drops every one. Where none
  answers, the compat tests that need it are skipped with the reason.
- A test that stops and starts PostgreSQL gets a cluster of its own made by that server's
  `initdb`/`pg_ctl` (`SCHEDULER_COMPAT_PG_BINDIR`, default `/usr/lib/postgresql/15/bin`), run as
  the `postgres` user when the suite runs as root (initdb refuses root).
"""

from __future__ import annotations

import asyncio
import functools
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import asyncpg

from scheduler.embedded import NatsServer, free_port
from tests import tools

COMPAT_PG_MAJOR = 15
DEFAULT_COMPAT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
DEFAULT_PG_BINDIR = f"/usr/lib/postgresql/{COMPAT_PG_MAJOR}/bin"


@dataclass(frozen=True)
class Servers:
    """Which servers a test runs against (`current` or `compat`)."""

    name: str
    nats_binary: str | None = None  # None: the venv's nats-server
    pg_admin_dsn: str | None = None  # None: the session's own pgserver (or DATABASE_URL)
    pg_skip: str | None = None  # why the compat PostgreSQL cannot be used
    pg_bindir: Path | None = None  # initdb/pg_ctl for a test's own PostgreSQL; None: pgserver
    pg_bindir_skip: str | None = None


CURRENT = Servers("current")


@functools.cache
def compat_servers() -> Servers:
    """The compat profile, probed once per session."""
    nats = os.environ.get("SCHEDULER_COMPAT_NATS_SERVER") or str(tools.nats_server_compat())
    dsn = os.environ.get("SCHEDULER_COMPAT_DATABASE_URL") or DEFAULT_COMPAT_DSN
    bindir = Path(os.environ.get("SCHEDULER_COMPAT_PG_BINDIR") or DEFAULT_PG_BINDIR)
    bindir_ok = (bindir / "initdb").is_file() and (bindir / "pg_ctl").is_file()
    return Servers(
        "compat",
        nats_binary=nats,
        pg_admin_dsn=dsn,
        pg_skip=asyncio.run(_pg_problem(dsn)),
        pg_bindir=bindir if bindir_ok else None,
        pg_bindir_skip=None
        if bindir_ok
        else f"no PostgreSQL {COMPAT_PG_MAJOR} initdb/pg_ctl in {bindir} "
        "(set SCHEDULER_COMPAT_PG_BINDIR)",
    )


async def _pg_problem(dsn: str) -> str | None:
    """None when `dsn` reaches a PostgreSQL 15 that lets us create databases, else why not."""
    where = dsn.rsplit("@", 1)[-1]
    try:
        conn = await asyncpg.connect(dsn, timeout=3)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        return (
            f"no PostgreSQL {COMPAT_PG_MAJOR} answers at {where} ({type(exc).__name__}: {exc}); "
            "set SCHEDULER_COMPAT_DATABASE_URL"
        )
    try:
        version = int(await conn.fetchval("SHOW server_version_num"))
        can_create = await conn.fetchval(
            "SELECT rolsuper OR rolcreatedb FROM pg_roles WHERE rolname = current_user"
        )
    finally:
        await conn.close()
    if version // 10000 != COMPAT_PG_MAJOR:
        return f"the PostgreSQL at {where} is {version // 10000}, not {COMPAT_PG_MAJOR}"
    if not can_create:
        return f"the role of SCHEDULER_COMPAT_DATABASE_URL cannot CREATE DATABASE at {where}"
    return None


class NatsServerOf(NatsServer):
    """A NatsServer that runs `binary` (None: the venv's nats-server), on every (re)start."""

    def __init__(self, store_dir: Path, binary: str | None, **kwargs: Any) -> None:
        super().__init__(store_dir, **kwargs)
        self.binary = binary

    def start(self, timeout: float = 10.0) -> NatsServer:
        if self.binary is None:
            return super().start(timeout)
        with mock.patch("scheduler.embedded.nats_server_binary", return_value=self.binary):
            return super().start(timeout)


class ClusterPostgres:
    """A PostgreSQL cluster of a test's own, made with a server installation's initdb and
    pg_ctl, on a free loopback port; stop() and start() keep its URL."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="mqs-pg-"))
        self.data = self.root / "data"
        self._as = self._user_prefix()
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")
        self.start()

    def _user_prefix(self) -> list[str]:
        if os.geteuid() != 0:
            return []
        user = pwd.getpwnam("postgres")  # initdb refuses to run as root
        os.chown(self.root, user.pw_uid, user.pw_gid)
        return ["runuser", "-u", "postgres", "--"]

    def _run(self, tool: str, *args: str) -> None:
        cmd = [*self._as, str(self.bindir / tool), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"{tool} failed: {proc.stdout}\n{proc.stderr}")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        opts = f"-h 127.0.0.1 -p {self.port} -k {self.root}"
        log = str(self.root / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", log, "-w", "-t", "30", "start")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop")

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
