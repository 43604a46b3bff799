"""Spark test harness: one local SparkSession for the session, and PostgreSQL over TCP for JDBC.

The session runs `local[2]` with the PostgreSQL JDBC driver on its class path (Debian's
`libpostgresql-jdbc-java`, which `scripts/test` installs when missing). Audits run in-process
through `scheduler.cli.main.main`, reusing this session: one JVM start for the whole suite.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import pwd
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from scheduler.audit import session as audit_session
from scheduler.audit.inputs import DEFAULT_JDBC_JAR, JDBC_JAR_ENV
from scheduler.cli.main import main
from scheduler.daemon import migrate
from scheduler.daemon.embedded import free_port, wait_for_port


def jdbc_jar_path() -> str:
    return os.environ.get(JDBC_JAR_ENV) or DEFAULT_JDBC_JAR


# Every JVM the Spark tests start (the session's, and the standalone cluster's master, worker,
# drivers and executors) compiles with C1 only and collects with the serial collector: they
# live seconds to minutes on small data, where C2's compile threads cost more than they win.
# Three audits on one session: 88.5 s and 87 s of CPU with the JVM's defaults, 51.8 s and
# 57 s so (2-core host). Production's audit keeps the JVM's defaults.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture(scope="session", autouse=True)
def _test_jvm_options() -> Iterator[None]:
    """JAVA_TOOL_OPTIONS for the JVMs of the Spark tests (the caller's own value wins)."""
    before = os.environ.get("JAVA_TOOL_OPTIONS")
    if before is None:
        os.environ["JAVA_TOOL_OPTIONS"] = TEST_JVM_OPTIONS
    yield
    if before is None:
        os.environ.pop("JAVA_TOOL_OPTIONS", None)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session's SparkSession (local[2], UTC, quiet), stopped at the end."""
    jar = jdbc_jar_path()
    jars = [jar] if Path(jar).is_file() else []
    log = tmp_path_factory.mktemp("spark") / "spark.log"
    # two shuffle partitions for the two local cores (the audit's default is 16, for real
    # days): the suite's logs are a few thousand records, and each empty partition is a task
    # (a warm audit 7.9-9.5 s against 10.0-11.8 s with 16)
    conf = {"spark.sql.shuffle.partitions": "2"}
    session, owned = audit_session.start("local[2]", jars, log, conf)
    yield session
    if owned:
        session.stop()


@dataclass
class AuditRun:
    code: int
    out: Path
    stdout: str
    stderr: str

    @property
    def summary(self) -> dict[str, Any]:
        summary: dict[str, Any] = json.loads((self.out / "summary.json").read_text())
        return summary


def run_audit(out: Path, *args: str) -> AuditRun:
    """`scheduler audit ... --out OUT` in this process (on the session's SparkSession)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["audit", *args, *(() if "--out" in args else ("--out", str(out)))])
    return AuditRun(code, out, stdout.getvalue(), stderr.getvalue())


def audit_synth(synth: Any, folder: Path, *args: str) -> AuditRun:
    """Write `synth` as Parquet with its schedules under `folder` and audit its day."""
    synth.write_parquet(folder / "log")
    synth.write_schedules(folder / "schedules")
    return run_audit(
        folder / "out",
        "--date",
        synth.day.isoformat(),
        "--input",
        str(folder / "log"),
        "--schedules",
        str(folder / "schedules"),
        *args,
    )


class TcpPostgres:
    """pgserver's bundled PostgreSQL started with a TCP listener on 127.0.0.1 (JDBC needs TCP)."""

    def __init__(self, data: Path) -> None:
        self.data = data
        self.port = free_port()
        self.user = "pgserver" if os.geteuid() == 0 else None

    def _pg_ctl(self, *args: str) -> None:
        from pgserver._commands import POSTGRES_BIN_PATH

        command = [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(self.data / "pgdata"), *args]
        subprocess.run(command, check=True, capture_output=True, user=self.user, timeout=60)

    def start(self) -> TcpPostgres:
        from pgserver.postgres_server import get_server

        # pgserver creates the cluster (and, as root, its system user and permissions) ...
        get_server(self.data / "pgdata", cleanup_mode="stop").cleanup()
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.data, entry.pw_uid, entry.pw_gid)
        # ... and we start it again listening on TCP
        log = str(self.data / "tcp.log")
        options = f"-h 127.0.0.1 -p {self.port} -k {self.data / 'pgdata'}"
        self._pg_ctl("-w", "-o", options, "-l", log, "start")
        wait_for_port("127.0.0.1", self.port)
        return self

    def stop(self) -> None:
        self._pg_ctl("-w", "-m", "fast", "stop")

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"


@pytest.fixture(scope="session")
def pg_tcp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TcpPostgres]:
    """A PostgreSQL reached over TCP on a free port, for the session."""
    server = TcpPostgres(tmp_path_factory.mktemp("pgtcp")).start()
    yield server
    server.stop()


@pytest.fixture
def tcp_database(pg_tcp: TcpPostgres) -> Iterator[str]:
    """A fresh database migrated to head on the TCP PostgreSQL; dropped afterwards."""
    name = f"audit_{uuid.uuid4().hex[:10]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(pg_tcp.dsn())
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    migrate.upgrade(pg_tcp.dsn(name))
    yield pg_tcp.dsn(name)
    asyncio.run(admin(f'DROP DATABASE "{name}" WITH (FORCE)'))
