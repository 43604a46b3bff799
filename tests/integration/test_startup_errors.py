"""Unhappy starts, as a user meets them: `scheduler run` / `scheduler migrate` as real processes
against a NATS URL pointing nowhere, a wrong database URL, a taken port, and signals sent at
each point of the start. Each ends in one line on stderr naming the setting, a documented exit
status, no traceback, and a bounded time to exit (docs/operations.md, "Start-up errors")."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import psutil
import pytest

from scheduler.daemon.embedded import NatsServer, free_port
from tests.conftest import _dsn_for
from tests.support.nats_filter import JetStreamSwallower
from tests.support.processes import CliProcess, SilentServer, cli_env, scheduler

pytestmark = pytest.mark.slow

EXIT_CONFIG, EXIT_UNAVAILABLE = 2, 4
MIGRATION_LOCK = 0x6D717363  # migrations/env.py
NOWHERE_DB = "postgresql://app@127.0.0.1:9/app"  # never reached in the NATS cases


def assert_no_traceback(proc: CliProcess) -> None:
    text = "\n".join(proc.err)
    assert "Traceback" not in text, proc.transcript()


def stop_and_time(proc: CliProcess, sig: int) -> tuple[int, float]:
    """Send `sig`; the exit status and the seconds from the signal to the exit."""
    sent = proc.signal(sig)
    code = proc.wait_exit(within=5)
    return code, time.monotonic() - sent


def assert_stopped_quietly(proc: CliProcess, code: int, took: float) -> None:
    assert took < 1.0, f"took {took:.2f}s to stop\n{proc.transcript()}"
    assert code == 0, proc.transcript()
    assert "stopped during start-up" in proc.last_err_line(), proc.transcript()
    assert_no_traceback(proc)


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


# -- item 14: NATS pointing nowhere -----------------------------------------------------------


@pytest.mark.parametrize("server", ["refused", "silent"])
def test_unreachable_nats_is_named_at_once_then_given_up_after_the_budget(
    tmp_path: Path, silent: SilentServer, server: str
) -> None:
    """A NATS URL that refuses, or whose server never answers, is reported within 5 s of the
    start (credentials hidden, the variable named), and after SCHEDULER_STARTUP_TIMEOUT the run
    ends with one line and exit status 4."""
    port = free_port() if server == "refused" else silent.port
    cause = "connection refused" if server == "refused" else "timed out (nothing answered)"
    env = cli_env(
        tmp_path,
        SCHEDULER_NATS_URL=f"nats://app:s3cret@127.0.0.1:{port}",
        SCHEDULER_DATABASE_URL=NOWHERE_DB,
        SCHEDULER_STARTUP_TIMEOUT="3s",
    )
    with scheduler(["run"], env) as proc:
        # 5 s from the first try, not from the process's birth: the interpreter's start (about
        # 2 s of imports) took over 5 s on an oversubscribed host before anything was tried
        proc.wait_for("phase='connecting to NATS'", within=30)
        warning = proc.wait_for("SCHEDULER_NATS_URL", within=5)
        assert "app:***@127.0.0.1" in warning and cause in warning, warning
        code = proc.wait_exit(within=12)
        elapsed = time.monotonic() - proc.started
    assert code == EXIT_UNAVAILABLE, proc.transcript()
    assert 3 <= elapsed < 12
    last = proc.last_err_line()
    assert last.startswith("scheduler: NATS unavailable: nats://app:***@127.0.0.1:"), last
    assert cause in last and "SCHEDULER_NATS_URL" in last, last
    assert "s3cret" not in proc.transcript()
    assert_no_traceback(proc)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_signal_while_connecting_to_nats_stops_within_a_second(
    tmp_path: Path, silent: SilentServer, sig: int
) -> None:
    """Ctrl-C or SIGTERM while the first NATS connect hangs ends the process within 1 s."""
    env = cli_env(
        tmp_path,
        SCHEDULER_NATS_URL=f"nats://127.0.0.1:{silent.port}",
        SCHEDULER_DATABASE_URL=NOWHERE_DB,
    )
    with scheduler(["run"], env) as proc:
        silent.wait_for_client(within=10)
        code, took = stop_and_time(proc, sig)
    assert_stopped_quietly(proc, code, took)


async def test_sigterm_while_connecting_to_postgres_stops_within_a_second(
    tmp_path: Path, nats_url: str, silent: SilentServer
) -> None:
    """SIGTERM while the first PostgreSQL connect hangs ends the process within 1 s."""
    env = cli_env(
        tmp_path,
        SCHEDULER_NATS_URL=nats_url,
        SCHEDULER_DATABASE_URL=f"postgresql://app@127.0.0.1:{silent.port}/app",
    )
    with scheduler(["run"], env) as proc:
        await asyncio.to_thread(silent.wait_for_client, 20)
        code, took = await asyncio.to_thread(stop_and_time, proc, signal.SIGTERM)
    assert_stopped_quietly(proc, code, took)


@pytest.fixture
async def empty_database(pg_admin_dsn: str) -> AsyncIterator[str]:
    """A database with no schema yet (the daemon's start migrates it)."""
    name = f"mqs_empty_{free_port()}"
    admin = await asyncpg.connect(pg_admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield _dsn_for(pg_admin_dsn, name)
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def test_sigterm_while_migrating_stops_within_a_second(
    tmp_path: Path, nats_url: str, empty_database: str
) -> None:
    """SIGTERM while the migration waits (another replica holds the migration lock) ends the
    process within 1 s, and the schema is left untouched."""
    holder = await asyncpg.connect(empty_database)
    try:
        await holder.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
        env = cli_env(tmp_path, SCHEDULER_NATS_URL=nats_url, SCHEDULER_DATABASE_URL=empty_database)
        with scheduler(["run"], env) as proc:
            async with asyncio.timeout(20):
                while not await holder.fetchval(  # noqa: ASYNC110 (a server's state, no event)
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                ):
                    await asyncio.sleep(0.02)
            code, took = await asyncio.to_thread(stop_and_time, proc, signal.SIGTERM)
        assert_stopped_quietly(proc, code, took)
        assert await holder.fetchval("SELECT to_regclass('delayed_messages')") is None
    finally:
        await holder.close()


@pytest.fixture
def nats_without_jetstream_rights(tmp_path: Path) -> Iterator[str]:
    """A nats-server whose user may not use the JetStream API (a missing permission)."""
    conf = tmp_path / "nats.conf"
    conf.write_text(
        "authorization { users = [ { user: sched, password: pw,"
        ' permissions: { publish: { deny: ["$JS.API.>"] } } } ] }\n'
    )
    server = NatsServer(tmp_path / "nats-denied", extra=["-c", str(conf)]).start()
    yield f"nats://sched:pw@127.0.0.1:{server.port}"
    server.stop()


async def test_ctrl_c_while_provisioning_stops_within_a_second(
    tmp_path: Path, database_url: str, nats_service: tuple[str, int | None]
) -> None:
    """Ctrl-C while provisioning waits on the JetStream API ends the process within 1 s."""
    upstream = int(nats_service[0].rsplit(":", 1)[1])
    proxy = await JetStreamSwallower(upstream).start()
    try:
        env = cli_env(tmp_path, SCHEDULER_NATS_URL=proxy.url, SCHEDULER_DATABASE_URL=database_url)
        with scheduler(["run"], env) as proc:
            async with asyncio.timeout(20):
                await proxy.swallowed.wait()
            code, took = await asyncio.to_thread(stop_and_time, proc, signal.SIGINT)
    finally:
        await proxy.close()
    assert_stopped_quietly(proc, code, took)


def test_sigterm_while_embedded_postgres_initialises_stops_within_a_second(
    tmp_path: Path,
) -> None:
    """SIGTERM while the embedded PostgreSQL runs initdb ends the process within 1 s and leaves
    no server process behind."""
    env = cli_env(tmp_path)
    with scheduler(["run", "--embedded"], env) as proc:
        deadline = time.monotonic() + 20
        while not any(c.name() == "initdb" for c in _children(proc.pid)):
            assert time.monotonic() < deadline and proc.proc.poll() is None, proc.transcript()
            time.sleep(0.01)
        children = _children(proc.pid)
        code, took = stop_and_time(proc, signal.SIGTERM)
    assert_stopped_quietly(proc, code, took)
    left = [p for p in _data_dir_processes(tmp_path / "data")] + [
        c for c in children if _running(c)
    ]
    assert not left, left


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _data_dir_processes(data_dir: Path) -> list[psutil.Process]:
    """Processes (a postmaster, a nats-server) whose command line names `data_dir`."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if any(str(data_dir) in arg for arg in proc.info["cmdline"] or []) and _running(proc):
            found.append(proc)
    return found


# -- item 15: a wrong database URL ----------------------------------------------------------------


def _unknown_database(admin: str) -> str:
    return _dsn_for(admin, "no_such_database")


def _as_user(dsn: str, user: str) -> str:
    """`dsn` with its user (and password) replaced, whatever form the original took."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.netloc.rpartition('@')[2]}"))


def _unknown_role(admin: str) -> str:
    return _as_user(admin, "nobody:s3cret")


PERMANENT = {
    "unknown-database": (_unknown_database, 'database "no_such_database" does not exist'),
    "unknown-role": (_unknown_role, 'role "nobody" does not exist'),
}


@pytest.mark.parametrize("verb", ["run", "migrate"])
@pytest.mark.parametrize("case", sorted(PERMANENT))
async def test_wrong_database_url_fails_at_once_with_one_line(
    tmp_path: Path, nats_url: str, pg_admin_dsn: str, verb: str, case: str
) -> None:
    """An unknown database or role is not retried: one line naming SCHEDULER_DATABASE_URL
    (password hidden) and the cause, exit status 2."""
    make_url, cause = PERMANENT[case]
    url = make_url(pg_admin_dsn)
    env = cli_env(
        tmp_path,
        SCHEDULER_NATS_URL=nats_url,
        SCHEDULER_DATABASE_URL=url,
        SCHEDULER_STARTUP_TIMEOUT="60s",
    )
    with scheduler([verb], env) as proc:
        code = await asyncio.to_thread(proc.wait_exit, 15)
    assert code == EXIT_CONFIG, proc.transcript()
    last = proc.last_err_line()
    assert last.startswith("scheduler: configuration error: SCHEDULER_DATABASE_URL: "), last
    assert cause in last, last
    assert "s3cret" not in proc.transcript()
    assert_no_traceback(proc)


UNREACHABLE: dict[str, tuple[Callable[[], str], str]] = {
    "refused": (lambda: f"postgresql://app:s3cret@127.0.0.1:{free_port()}/app", "refused"),
    "unknown-host": (lambda: "postgresql://app:s3cret@nohost.invalid/app", "unknown host"),
}


@pytest.mark.parametrize(
    ("verb", "case"), [("run", "refused"), ("run", "unknown-host"), ("migrate", "refused")]
)
async def test_unreachable_database_is_retried_for_the_budget_then_one_line(
    tmp_path: Path, nats_url: str, verb: str, case: str
) -> None:
    """A refused connection or an unknown host is named at once (password hidden), retried for
    SCHEDULER_STARTUP_TIMEOUT, then ends with "PostgreSQL unavailable" and exit status 4."""
    make_url, cause = UNREACHABLE[case]
    env = cli_env(
        tmp_path,
        SCHEDULER_NATS_URL=nats_url,
        SCHEDULER_DATABASE_URL=make_url(),
        SCHEDULER_STARTUP_TIMEOUT="2s",
    )
    with scheduler([verb], env) as proc:
        warning = await asyncio.to_thread(proc.wait_for, "SCHEDULER_DATABASE_URL", 5)
        assert cause in warning and "app:***@" in warning, warning
        code = await asyncio.to_thread(proc.wait_exit, 15)
        elapsed = time.monotonic() - proc.started
    assert code == EXIT_UNAVAILABLE, proc.transcript()
    assert elapsed >= 2
    last = proc.last_err_line()
    assert last.startswith("scheduler: PostgreSQL unavailable: postgresql://app:***@"), last
    assert cause in last and "SCHEDULER_DATABASE_URL" in last, last
    assert "s3cret" not in proc.transcript()
    assert_no_traceback(proc)


# -- item 16: ports --------------------------------------------------------------------------


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


@pytest.mark.parametrize("variable", ["SCHEDULER_HTTP_PORT", "SCHEDULER_METRICS_PORT"])
def test_taken_port_names_the_variable_and_the_fix(
    tmp_path: Path, taken_port: int, variable: str
) -> None:
    """A port already in use ends the start with one line naming the variable and `0`."""
    env = cli_env(
        tmp_path, SCHEDULER_NATS_URL="nats://127.0.0.1:9", SCHEDULER_DATABASE_URL=NOWHERE_DB
    )
    env[variable] = str(taken_port)
    with scheduler(["run"], env) as proc:
        code = proc.wait_exit(within=15)
    assert code == EXIT_CONFIG, proc.transcript()
    last = proc.last_err_line()
    assert last.startswith(f"scheduler: configuration error: {variable}: "), last
    assert f"port {taken_port} on 127.0.0.1 is already in use" in last, last
    assert "0 picks a free port" in last, last
    assert_no_traceback(proc)


# -- NATS reachable, but not usable ----------------------------------------------------------


async def test_missing_jetstream_permission_is_one_line_naming_the_setting(
    tmp_path: Path, database_url: str, nats_without_jetstream_rights: str
) -> None:
    """A NATS user that may not use the JetStream API ends the start at once with one line
    naming the setting and the subject refused (exit status 2), not after a timeout."""
    env = cli_env(
        tmp_path,
        SCHEDULER_NATS_URL=nats_without_jetstream_rights,
        SCHEDULER_DATABASE_URL=database_url,
    )
    with scheduler(["run"], env) as proc:
        await asyncio.to_thread(proc.wait_for, "(?i)permissions violation", 20)
        denied = time.monotonic()
        code = await asyncio.to_thread(proc.wait_exit, 15)
    assert time.monotonic() - denied < 2, proc.transcript()
    assert code == EXIT_CONFIG, proc.transcript()
    last = proc.last_err_line()
    assert last.startswith("scheduler: configuration error: SCHEDULER_NATS_URL: "), last
    assert "may not publish to $JS.API." in last and "sched:***@" in last, last
    assert_no_traceback(proc)


async def test_nats_without_jetstream_is_one_line_naming_the_fix(
    tmp_path: Path, database_url: str
) -> None:
    """A nats-server without JetStream ends the start with one line saying to enable it."""
    server = NatsServer(tmp_path / "plain", jetstream=False).start()
    try:
        env = cli_env(tmp_path, SCHEDULER_NATS_URL=server.url, SCHEDULER_DATABASE_URL=database_url)
        with scheduler(["run"], env) as proc:
            code = await asyncio.to_thread(proc.wait_exit, 15)
    finally:
        server.stop()
    assert code == EXIT_CONFIG, proc.transcript()
    last = proc.last_err_line()
    assert last.startswith("scheduler: configuration error: SCHEDULER_NATS_URL: "), last
    assert "JetStream is not enabled" in last, last
    assert_no_traceback(proc)


async def test_migration_without_create_permission_is_one_line(
    tmp_path: Path, empty_database: str
) -> None:
    """A database user who may not create tables gets one line from `scheduler migrate`
    naming SCHEDULER_DATABASE_URL and the missing permission (exit status 2)."""
    admin = await asyncpg.connect(empty_database)
    try:
        await admin.execute(
            "DO $$ BEGIN CREATE ROLE mqs_reader LOGIN; "
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
        url = _as_user(empty_database, "mqs_reader")
        env = cli_env(tmp_path, SCHEDULER_DATABASE_URL=url)
        with scheduler(["migrate"], env) as proc:
            code = await asyncio.to_thread(proc.wait_exit, 15)
    finally:
        await admin.close()
    assert code == EXIT_CONFIG, proc.transcript()
    last = proc.last_err_line()
    assert last.startswith("scheduler: configuration error: SCHEDULER_DATABASE_URL: "), last
    assert "permission denied for schema public" in last, last
    assert_no_traceback(proc)
