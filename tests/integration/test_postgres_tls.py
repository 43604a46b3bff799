"""PostgreSQL over TLS with a password from a file (issue 18 item 4): a server of the test's own
with `ssl=on` and a certificate from a CA made in the test, that refuses connections without
TLS. The daemon reaches it with `sslmode=verify-full&sslrootcert=` in SCHEDULER_DATABASE_URL and
SCHEDULER_DATABASE_PASSWORD_FILE; a CA that did not sign the server's certificate, or a wrong
password in the file, ends the start with one line naming the setting, no traceback."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from scheduler.daemon import migrate
from scheduler.settings import Settings
from tests.support.compat import ClusterPostgres, Servers, compat_servers
from tests.support.helpers import DaemonRunner, served_text, wait_until
from tests.support.processes import cli_env, scheduler
from tests.support.tls import CertificateAuthority

EXIT_CONFIG = 2
PASSWORD = "pg-Kw9-s3cret"


class TlsPostgres(ClusterPostgres):
    """A cluster made by `bindir`'s initdb, run as `user`, with TLS on (the server's certificate
    from `ca`), only TLS connections admitted over TCP, and passwords required for role `app`."""

    def __init__(self, bindir: Path, user: str, ca: CertificateAuthority) -> None:
        self.user = user
        self.server_pem = ca.issue("pg-server")
        super().__init__(bindir)

    def _user_prefix(self) -> list[str]:
        import os
        import pwd

        if os.geteuid() != 0:
            return []
        user = pwd.getpwnam(self.user)  # initdb refuses to run as root
        os.chown(self.root, user.pw_uid, user.pw_gid)
        self._uid = (user.pw_uid, user.pw_gid)
        return ["runuser", "-u", self.user, "--"]

    def start(self) -> None:
        self._install_tls()
        cert, key = self.root / "server.crt", self.root / "server.key"
        opts = (
            f"-h 127.0.0.1 -p {self.port} -k {self.root} -c ssl=on "
            f"-c ssl_cert_file={cert} -c ssl_key_file={key}"
        )
        log = str(self.root / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", log, "-w", "-t", "30", "start")

    def _install_tls(self) -> None:
        import os

        for src, name in (
            (self.server_pem.cert, "server.crt"),
            (self.server_pem.key, "server.key"),
        ):
            shutil.copy(src, self.root / name)
            if hasattr(self, "_uid"):
                os.chown(self.root / name, *self._uid)
            (self.root / name).chmod(0o600)
        hba = self.data / "pg_hba.conf"
        rules = (
            "local all all trust\n"
            "hostssl all app 127.0.0.1/32 scram-sha-256\n"
            "hostssl all all 127.0.0.1/32 trust\n"
            "hostnossl all all 127.0.0.1/32 reject\n"
        )
        hba.write_text(rules)

    @property
    def admin_dsn(self) -> str:
        return f"postgresql://postgres@/postgres?host={self.root}&port={self.port}"

    def app_url(self, ca: Path, password: str | None = None) -> str:
        secret = f":{password}" if password else ""
        return (
            f"postgresql://app{secret}@127.0.0.1:{self.port}/app"
            f"?sslmode=verify-full&sslrootcert={ca}"
        )


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CertificateAuthority:
    return CertificateAuthority(tmp_path_factory.mktemp("pg-pki"))


@pytest.fixture
def tls_pg(servers: Servers, ca: CertificateAuthority) -> Iterator[TlsPostgres]:
    """The TLS server, made with the machine's PostgreSQL installation in both runs: pgserver's
    build has no SSL ("SSL is not supported by this build"). The runs differ in nats-server."""
    bindir = servers.pg_bindir or compat_servers().pg_bindir
    if bindir is None:
        pytest.skip(compat_servers().pg_bindir_skip or "no PostgreSQL installation")
    pg = TlsPostgres(bindir, "postgres", ca)
    yield pg
    pg.remove()


@pytest.fixture
async def app_db(tls_pg: TlsPostgres) -> AsyncIterator[TlsPostgres]:
    """Role `app` (password PASSWORD) owning database `app`."""
    admin = await asyncpg.connect(tls_pg.admin_dsn)
    try:
        await admin.execute(f"CREATE ROLE app LOGIN PASSWORD '{PASSWORD}'")
        await admin.execute("CREATE DATABASE app OWNER app")
    finally:
        await admin.close()
    yield tls_pg


def password_file(tmp_path: Path, password: str, name: str = "pg-password") -> Path:
    path = tmp_path / name
    path.write_text(password + "\n")
    path.chmod(0o600)
    return path


async def test_the_daemon_runs_over_verified_tls_with_a_password_file(
    app_db: TlsPostgres,
    ca: CertificateAuthority,
    nats_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With sslmode=verify-full, the test CA and the password in a file, migrations run and the
    daemon becomes ready; every connection it holds is encrypted, and the password appears in
    no log line and not in /readyz."""
    (tmp_path / "schedules").mkdir()
    settings = Settings(
        nats_url=nats_url,
        database_url=app_db.app_url(ca.pem),
        database_password_file=password_file(tmp_path, PASSWORD),
        schedules_dir=tmp_path / "schedules",
        data_dir=tmp_path / "data",
        http_port=0,
        metrics_port=0,
        instance_id="pg-tls-1",
        lease_ttl=3,
    )
    caplog.set_level("DEBUG")
    runner = DaemonRunner(settings)
    daemon = await runner.start()
    try:
        await wait_until(lambda: daemon.readiness()[0], 10)
        body = json.dumps(daemon.readiness()[1]) + await served_text(daemon)
        admin = await asyncpg.connect(app_db.admin_dsn)
        try:
            rows = await admin.fetch(
                "SELECT s.ssl, a.client_addr FROM pg_stat_ssl s JOIN pg_stat_activity a "
                "USING (pid) WHERE a.usename = 'app'"
            )
        finally:
            await admin.close()
    finally:
        await runner.stop()
    assert rows and all(r["ssl"] for r in rows), rows
    assert '"ready":true' in body.replace(" ", "") and "mq_scheduler_" in body, body
    assert PASSWORD not in caplog.text and PASSWORD not in body
    assert PASSWORD not in repr(settings)


async def test_migrate_runs_over_verified_tls(
    app_db: TlsPostgres, ca: CertificateAuthority
) -> None:
    """`scheduler migrate`'s Alembic path takes the same URL (sslrootcert included)."""
    dsn = app_db.app_url(ca.pem, PASSWORD)
    await asyncio.to_thread(migrate.upgrade, dsn)
    conn = await asyncpg.connect(dsn)
    try:
        assert await conn.fetchval("SELECT to_regclass('delayed_messages') IS NOT NULL")
    finally:
        await conn.close()


@pytest.mark.parametrize("verb", ["run", "migrate"])
@pytest.mark.parametrize("case", ["stranger-ca", "expired-server", "wrong-password", "no-tls"])
async def test_a_wrong_ca_or_password_stops_the_start_with_one_line(
    app_db: TlsPostgres,
    ca: CertificateAuthority,
    nats_url: str,
    tmp_path: Path,
    verb: str,
    case: str,
) -> None:
    """A CA that did not sign the server's certificate, a server certificate that has expired, a
    wrong password in the file, or a URL without TLS (the server refuses it) ends `scheduler
    run` / `migrate` at once with one line naming the setting (exit status 2), no traceback, no
    password."""
    good = password_file(tmp_path, PASSWORD)
    if case == "expired-server":
        await asyncio.to_thread(app_db.stop)
        app_db.server_pem = ca.issue("pg-server-old", expired=True)
        await asyncio.to_thread(app_db.start)
    url, file, words = {
        "stranger-ca": (
            app_db.app_url(CertificateAuthority(tmp_path / "other", "other CA").pem),
            good,
            "TLS failed",
        ),
        "expired-server": (app_db.app_url(ca.pem), good, "certificate has expired"),
        "wrong-password": (
            app_db.app_url(ca.pem),
            password_file(tmp_path, "wr0ng-s3cret", "wrong"),
            "",
        ),
        "no-tls": (
            app_db.app_url(ca.pem).split("?")[0] + "?sslmode=disable",
            good,
            "no encryption",
        ),
    }[case]
    env = cli_env(
        tmp_path,
        SCHEDULER_NATS_URL=nats_url,
        SCHEDULER_DATABASE_URL=url,
        SCHEDULER_DATABASE_PASSWORD_FILE=str(file),
    )
    with scheduler([verb], env) as proc:
        code = await asyncio.to_thread(proc.wait_exit, 20)
    assert code == EXIT_CONFIG, proc.transcript()
    line = proc.last_err_line()
    assert line.startswith("scheduler: configuration error: SCHEDULER_DATABASE_URL: "), line
    assert words in line, line
    if case == "wrong-password":
        assert "SCHEDULER_DATABASE_PASSWORD_FILE" in line, line
    text = proc.transcript()
    assert "Traceback" not in text and "wr0ng-s3cret" not in text and PASSWORD not in text, text
