"""The servers the suite runs against: its own (`current`) and what production runs (`compat`).

Every test that uses the server fixtures runs `[current]` on the suite's own servers (the venv's
nats-server, PostgreSQL from `pgserver`); where a version can change the answer (tests/conftest.py's
COMPAT_RUN) also `[compat]` (marker `compat`) on production's versions: nats-server 2.10
(installed beside the venv by `tests.support.tools`) and PostgreSQL 15.

- NATS: `SCHEDULER_COMPAT_NATS_SERVER` names another binary; by default the 2.10 release.
- PostgreSQL 15: a cluster of the suite's own, made once per session by Debian's PostgreSQL 15
  `initdb` and started with its `pg_ctl` on a free loopback port in a temp dir
  (`session_postgres`); the binaries come from `tests.support.tools.postgresql_15()`
  (`SCHEDULER_COMPAT_PG_BINDIR` names others). The machine's own PostgreSQL is never used,
  unless `SCHEDULER_COMPAT_DATABASE_URL` names a 15.x server that allows CREATE DATABASE (the
  suite creates its databases there and drops every one). Where neither can be had, the compat
  tests that need PostgreSQL are skipped with one line saying why.
- A test that stops and starts PostgreSQL gets a cluster of its own from the same binaries.
  When the suite runs as root the clusters run as the `postgres` user (or `pgserver`, or
  `nobody`): initdb refuses root.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import asyncpg
import pytest

from scheduler.daemon.embedded import NatsServer, Postgres, free_port
from tests.support import tools

COMPAT_PG_MAJOR = tools.PG_COMPAT_MAJOR
# A session cluster is thrown away at the end: durability buys the tests nothing.
FAST = ("-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off")
RUN_AS = ("postgres", "pgserver", "nobody")  # initdb refuses root: the first user that exists


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
    bindir, bindir_skip = _pg_bindir()
    dsn = os.environ.get("SCHEDULER_COMPAT_DATABASE_URL")
    if dsn:
        pg_skip = asyncio.run(_pg_problem(dsn))
    else:
        pg_skip = bindir_skip
    return Servers(
        "compat",
        nats_binary=nats,
        pg_admin_dsn=dsn or None,
        pg_skip=pg_skip,
        pg_bindir=bindir,
        pg_bindir_skip=bindir_skip,
    )


def _pg_bindir() -> tuple[Path | None, str | None]:
    """(PostgreSQL 15's bin dir, None) or (None, why there is none) in one line."""
    named = os.environ.get("SCHEDULER_COMPAT_PG_BINDIR")
    try:
        bindir = Path(named) if named else tools.postgresql_15()
    except tools.ToolError as exc:
        first = str(exc).splitlines()[0]
        return None, f"no PostgreSQL {COMPAT_PG_MAJOR} for the compat run: {first}"
    if not all((bindir / tool).is_file() for tool in ("initdb", "pg_ctl")):
        return (
            None,
            f"no PostgreSQL {COMPAT_PG_MAJOR} initdb/pg_ctl in {bindir} "
            "(set SCHEDULER_COMPAT_PG_BINDIR)",
        )
    return bindir, None


@contextmanager
def session_postgres(servers: Servers, tmp: Path) -> Iterator[str]:
    """The admin DSN of the session's PostgreSQL for `servers`: the compat run's own cluster
    (or SCHEDULER_COMPAT_DATABASE_URL), else DATABASE_URL, else a pgserver in `tmp`.
    Raises pytest's skip with the reason when the compat PostgreSQL cannot be had."""
    if servers.pg_skip:
        pytest.skip(servers.pg_skip)
    if servers.pg_admin_dsn:
        yield servers.pg_admin_dsn
    elif servers is not CURRENT and servers.pg_bindir is not None:
        cluster = ClusterPostgres(servers.pg_bindir, options=FAST)
        try:
            yield cluster.url
        finally:
            cluster.remove()
    elif os.environ.get("DATABASE_URL"):
        yield os.environ["DATABASE_URL"]
    else:
        with _one_start_at_a_time():
            pg = Postgres(tmp).start()
        try:
            yield pg.url
        finally:
            pg.stop()


@contextmanager
def _one_start_at_a_time() -> Iterator[None]:
    """Hold the machine-wide lock under which pgservers start. As root, pgserver makes its
    system user on first use (`useradd`) and hands it the data directory: two pytest-xdist
    workers doing it at once on a new machine left one initdb without access to its
    directory ("Permission denied"), and all of that worker's server tests erred."""
    lock = Path(tempfile.gettempdir()) / "mq-scheduler-test-pgserver.lock"
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


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
        with mock.patch("scheduler.daemon.embedded.nats_server_binary", return_value=self.binary):
            return super().start(timeout)


class ClusterPostgres:
    """A PostgreSQL cluster of a test's own, made with a server installation's initdb and
    pg_ctl, on a free loopback port; stop() and start() keep its URL."""

    def __init__(self, bindir: Path, options: tuple[str, ...] = ()) -> None:
        self.bindir = bindir
        self.options = " ".join(options)
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="mqs-pg-"))
        self.data = self.root / "data"
        self._as = self._user_prefix()
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")
        self.start()

    def _user_prefix(self) -> list[str]:
        if os.geteuid() != 0:
            return []
        user = _run_as_user()  # initdb refuses to run as root
        os.chown(self.root, user.pw_uid, user.pw_gid)
        return ["runuser", "-u", user.pw_name, "--"]

    def _run(self, tool: str, *args: str) -> None:
        cmd = [*self._as, str(self.bindir / tool), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise RuntimeError(f"{tool} failed: {proc.stdout}\n{proc.stderr}")

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        opts = f"-h 127.0.0.1 -p {self.port} -k {self.root} {self.options}".rstrip()
        log = str(self.root / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", log, "-w", "-t", "30", "start")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop")

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


def _run_as_user() -> pwd.struct_passwd:
    for name in RUN_AS:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError(f"running as root and none of the users {', '.join(RUN_AS)} exists")
