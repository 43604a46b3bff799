"""NATS that demands credentials and TLS (issue 18 item 1): a real nats-server with an
`authorization` block, with `accounts`, with NKey users and with TLS from a CA made in the test.
The daemon's connection gets in with the right SCHEDULER_NATS_* settings; with wrong ones
`scheduler run` ends with one line naming the setting to fix (exit status 2), no traceback, and no
secret anywhere in its output."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import nkeys
import pytest

from scheduler.bus.nats.connection import NatsBus
from scheduler.errors import ConfigError
from scheduler.metrics import Metrics
from scheduler.settings import Settings
from tests.support.compat import NatsServerOf, Servers
from tests.support.helpers import DaemonRunner, served_text, wait_until
from tests.support.natsjwt import Operator, new_key
from tests.support.processes import CliProcess, cli_env, scheduler
from tests.support.tls import CertificateAuthority

EXIT_CONFIG = 2
NOWHERE_DB = "postgresql://app@127.0.0.1:9/app"  # NATS is met first; never reached
PASSWORD, TOKEN = "pw-Xq7-s3cret", "tok-Zr4-s3cret"


def new_user_nkey() -> tuple[str, str]:
    """(seed, public key) of a fresh NKey user."""
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    return seed.decode(), nkeys.from_seed(seed).public_key.decode()


SEED, PUBLIC = new_user_nkey()
OTHER_SEED, _ = new_user_nkey()

StartNats = Callable[[str], str]


@pytest.fixture
def start_nats(servers: Servers, tmp_path: Path) -> Iterator[StartNats]:
    """Start a nats-server (this run's version, JetStream on) with the config text given; its
    client URL. Stopped at teardown."""
    started: list[NatsServerOf] = []

    def start(config: str) -> str:
        folder = tmp_path / f"nats{len(started)}"
        folder.mkdir()
        (folder / "nats.conf").write_text(config)
        server = NatsServerOf(folder, servers.nats_binary, extra=["-c", str(folder / "nats.conf")])
        started.append(server)
        server.start()
        return server.url

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, the server's certificate, a client certificate, expired ones and a stranger CA."""
    ca = CertificateAuthority(tmp_path_factory.mktemp("pki"))
    stranger = CertificateAuthority(ca.folder / "stranger", "another CA")
    server, old_server = ca.issue("server"), ca.issue("old-server", expired=True)
    client, old_client = (
        ca.issue("client", server=False),
        ca.issue("old", server=False, expired=True),
    )
    rogue = stranger.issue("rogue", server=False)
    return {
        "ca": ca.pem,
        "stranger_ca": stranger.pem,
        "server_cert": server.cert,
        "server_key": server.key,
        "old_server_cert": old_server.cert,
        "old_server_key": old_server.key,
        "client_cert": client.cert,
        "client_key": client.key,
        "old_client_cert": old_client.cert,
        "old_client_key": old_client.key,
        "rogue_cert": rogue.cert,
        "rogue_key": rogue.key,
    }


def tls_block(pki: dict[str, Path], *, verify: bool = False, server: str = "server") -> str:
    return (
        f'tls {{ cert_file: "{pki[server + "_cert"]}", key_file: "{pki[server + "_key"]}", '
        f'ca_file: "{pki["ca"]}", verify: {str(verify).lower()}, timeout: 2 }}\n'
    )


USERS = f'authorization {{ users = [ {{ user: sched, password: "{PASSWORD}" }} ] }}\n'
TOKENS = f'authorization {{ token: "{TOKEN}" }}\n'
NKEYS = f'authorization {{ users = [ {{ nkey: "{PUBLIC}" }} ] }}\n'
ACCOUNTS = (
    "accounts {\n"
    f'  APP: {{ jetstream: enabled, users: [ {{ user: sched, password: "{PASSWORD}" }},'
    f' {{ nkey: "{PUBLIC}" }} ] }}\n'
    '  OTHER: { users: [ { user: other, password: "other-pw" } ] }\n'
    "}\n"
)


def settings_for(url: str, **fields: object) -> Settings:
    return Settings(nats_url=url, instance_id="auth-1", **fields)  # type: ignore[arg-type]


async def connects(settings: Settings) -> str:
    """Connect as the daemon does and use JetStream once; the server version."""
    bus = NatsBus(settings, Metrics())
    try:
        await bus.connect(budget=5)
        assert bus.js is not None
        info = await bus.js.account_info()
        assert info is not None
        return bus.server_version
    finally:
        await bus.close()


def run_fails(tmp_path: Path, **env: str) -> tuple[CliProcess, str]:
    """`scheduler run` with these settings; it must end with exit status 2; its last line."""
    with scheduler(["run"], cli_env(tmp_path, SCHEDULER_DATABASE_URL=NOWHERE_DB, **env)) as proc:
        code = proc.wait_exit(within=20)
    assert code == EXIT_CONFIG, proc.transcript()
    assert "Traceback" not in proc.transcript(), proc.transcript()
    return proc, proc.last_err_line()


def assert_names(line: str, variable: str) -> None:
    assert line.startswith(f"scheduler: configuration error: {variable}: "), line


def assert_no_secret(proc: CliProcess, *secrets: str) -> None:
    text = proc.transcript()
    for secret in secrets:
        assert secret not in text, f"{secret!r} shown:\n{text}"


# -- the right credentials ------------------------------------------------------------------------


CASES: dict[str, tuple[str, dict[str, object]]] = {
    "user-password": (USERS, {"nats_user": "sched", "nats_password": PASSWORD}),
    "token": (TOKENS, {"nats_token": TOKEN}),
    "nkey-seed": (NKEYS, {"nats_nkey_seed": SEED}),
    "account-user": (ACCOUNTS, {"nats_user": "sched", "nats_password": PASSWORD}),
    "account-nkey": (ACCOUNTS, {"nats_nkey_seed": SEED}),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_the_daemon_connects_with_the_right_credentials(
    start_nats: StartNats, case: str
) -> None:
    """User and password, a token, an NKey seed, in the global `authorization` block or in an
    account with JetStream: the daemon's connection gets in and may use JetStream."""
    config, fields = CASES[case]
    url = await asyncio.to_thread(start_nats, config)
    assert await connects(settings_for(url, **fields))


async def test_an_nkey_seed_may_be_given_as_a_file(start_nats: StartNats, tmp_path: Path) -> None:
    """SCHEDULER_NATS_NKEY_SEED may name a seed file (as `nsc` writes them) instead."""
    url = await asyncio.to_thread(start_nats, NKEYS)
    seed_file = tmp_path / "sched.nk"
    seed_file.write_text(SEED + "\n")
    assert await connects(settings_for(url, nats_nkey_seed=str(seed_file)))


async def test_tls_with_the_ca_and_mutual_tls_with_a_client_certificate(
    start_nats: StartNats, pki: dict[str, Path]
) -> None:
    """A server with a certificate from the test's CA is reached with SCHEDULER_NATS_TLS_CA; a
    server that verifies clients, with SCHEDULER_NATS_TLS_CERT/_KEY as well (and a password)."""
    plain = await asyncio.to_thread(start_nats, tls_block(pki))
    assert await connects(settings_for(plain, nats_tls_ca=pki["ca"]))
    mutual = await asyncio.to_thread(start_nats, tls_block(pki, verify=True) + USERS)
    client = {"nats_tls_cert": pki["client_cert"], "nats_tls_key": pki["client_key"]}
    secret = {"nats_user": "sched", "nats_password": PASSWORD}
    assert await connects(settings_for(mutual, nats_tls_ca=pki["ca"], **client, **secret))
    tls_url = mutual.replace("nats://", "tls://")
    assert await connects(settings_for(tls_url, nats_tls_ca=pki["ca"], **client, **secret))


@pytest.fixture
def operator() -> Operator:
    return Operator()


async def test_the_daemon_connects_with_a_creds_file(
    start_nats: StartNats, operator: Operator, tmp_path: Path
) -> None:
    """In operator mode (JWTs, a memory resolver), a `.creds` file of a user of an account with
    JetStream gets the daemon's connection in."""
    url = await asyncio.to_thread(start_nats, operator.server_config(tmp_path))
    creds = operator.user_creds(tmp_path / "scheduler.creds")
    assert await connects(settings_for(url, nats_creds=creds))


CREDS_WRONG = {
    "expired-jwt": "the user's JWT has expired",
    "untrusted-signer": "the user's JWT is signed by a key its account does not trust",
    "not-creds": "the file holds no JWT",
}


@pytest.mark.parametrize("case", sorted(CREDS_WRONG))
async def test_a_refused_creds_file_stops_the_start_with_one_line(
    start_nats: StartNats, operator: Operator, tmp_path: Path, case: str
) -> None:
    """A `.creds` file the server refuses (expired, signed by an untrusted key) or that is no
    creds file ends `scheduler run` with one line naming SCHEDULER_NATS_CREDS; its seed is not
    in the output."""
    url = await asyncio.to_thread(start_nats, operator.server_config(tmp_path))
    path = tmp_path / "scheduler.creds"
    if case == "expired-jwt":
        operator.user_creds(path, expired=True)
    elif case == "untrusted-signer":
        operator.user_creds(path, signer=new_key(nkeys.PREFIX_BYTE_ACCOUNT))
    else:
        path.write_text("SUAM" + "B" * 54 + "\n")
    proc, line = await asyncio.to_thread(
        run_fails, tmp_path, SCHEDULER_NATS_URL=url, SCHEDULER_NATS_CREDS=str(path)
    )
    assert_names(line, "SCHEDULER_NATS_CREDS")
    seed = next(t for t in path.read_text().split() if t.startswith("SU"))
    assert_no_secret(proc, seed)


# -- wrong ones: one line naming the setting ------------------------------------------------------


WRONG: dict[str, tuple[str, dict[str, str], str]] = {
    "password": (
        USERS,
        {"SCHEDULER_NATS_USER": "sched", "SCHEDULER_NATS_PASSWORD": "wrong-s3cret"},
        "SCHEDULER_NATS_USER/SCHEDULER_NATS_PASSWORD",
    ),
    "no-credentials": (USERS, {}, "SCHEDULER_NATS_URL"),
    "token": (TOKENS, {"SCHEDULER_NATS_TOKEN": "wrong-s3cret"}, "SCHEDULER_NATS_TOKEN"),
    "nkey-seed": (NKEYS, {"SCHEDULER_NATS_NKEY_SEED": OTHER_SEED}, "SCHEDULER_NATS_NKEY_SEED"),
    "account-password": (
        ACCOUNTS,
        {"SCHEDULER_NATS_USER": "sched", "SCHEDULER_NATS_PASSWORD": "wrong-s3cret"},
        "SCHEDULER_NATS_USER/SCHEDULER_NATS_PASSWORD",
    ),
}


@pytest.mark.parametrize("case", sorted(WRONG))
async def test_wrong_credentials_stop_the_start_with_one_line(
    start_nats: StartNats, tmp_path: Path, case: str
) -> None:
    """A refused password, token or NKey ends `scheduler run` at once with one line naming the
    setting to fix (exit status 2); the secret tried is nowhere in the output."""
    config, env, variable = WRONG[case]
    url = await asyncio.to_thread(start_nats, config)
    proc, line = await asyncio.to_thread(run_fails, tmp_path, SCHEDULER_NATS_URL=url, **env)
    assert_names(line, variable)
    assert "credentials refused" in line, line
    assert_no_secret(proc, "wrong-s3cret", OTHER_SEED)


TLS_WRONG: dict[str, tuple[str, dict[str, str], str, str]] = {
    # server config, settings (names of pki files), variable, words in the line
    "stranger-ca": (
        "server",
        {"CA": "stranger_ca"},
        "SCHEDULER_NATS_TLS_CA",
        "the server's certificate: unable to get local issuer certificate",
    ),
    "expired-server": (
        "old_server",
        {"CA": "ca"},
        "SCHEDULER_NATS_TLS_CA",
        "the server's certificate: certificate has expired",
    ),
    "expired-client": (
        "server",
        {"CA": "ca", "CERT": "old_client_cert", "KEY": "old_client_key"},
        "SCHEDULER_NATS_TLS_CERT",
        "the server refused the client certificate (SSLV3_ALERT_CERTIFICATE_EXPIRED)",
    ),
    "client-of-another-ca": (
        "server",
        {"CA": "ca", "CERT": "rogue_cert", "KEY": "rogue_key"},
        "SCHEDULER_NATS_TLS_CERT",
        "the server refused the client certificate (TLSV1_ALERT_UNKNOWN_CA)",
    ),
    "no-client-certificate": (
        "server",
        {"CA": "ca"},
        "SCHEDULER_NATS_TLS_CERT",
        "the server requires a client certificate",
    ),
}


@pytest.mark.parametrize("case", sorted(TLS_WRONG))
async def test_a_wrong_ca_or_an_expired_certificate_stops_the_start_with_one_line(
    start_nats: StartNats, pki: dict[str, Path], tmp_path: Path, case: str
) -> None:
    """A server certificate the configured CA did not sign or that has expired, or a client
    certificate the server refuses (expired, another CA's, none), ends `scheduler run` with one
    line naming the TLS setting to fix (exit status 2), without a traceback."""
    server, files, variable, words = TLS_WRONG[case]
    verify = "CERT" in files or case == "no-client-certificate"
    url = await asyncio.to_thread(start_nats, tls_block(pki, verify=verify, server=server))
    env = {f"SCHEDULER_NATS_TLS_{k}": str(pki[v]) for k, v in files.items()}
    _, line = await asyncio.to_thread(run_fails, tmp_path, SCHEDULER_NATS_URL=url, **env)
    assert_names(line, variable)
    assert words in line, line


def test_a_tls_file_that_is_no_certificate_names_its_setting(
    tmp_path: Path, pki: dict[str, Path]
) -> None:
    """A CA file or a client certificate that is not PEM is named before any connection."""
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    _, line = run_fails(
        tmp_path, SCHEDULER_NATS_URL="nats://127.0.0.1:9", SCHEDULER_NATS_TLS_CA=str(junk)
    )
    assert_names(line, "SCHEDULER_NATS_TLS_CA")
    _, line = run_fails(
        tmp_path,
        SCHEDULER_NATS_URL="nats://127.0.0.1:9",
        SCHEDULER_NATS_TLS_CERT=str(pki["client_cert"]),
        SCHEDULER_NATS_TLS_KEY=str(junk),
    )
    assert_names(line, "SCHEDULER_NATS_TLS_CERT/SCHEDULER_NATS_TLS_KEY")


async def test_a_bad_tls_file_raises_config_error_from_connect(tmp_path: Path) -> None:
    """The connection itself reports a missing key file as a ConfigError naming the setting
    (not as an unreachable URL retried for the start-up budget)."""
    cert = tmp_path / "c.pem"
    cert.write_text("x")
    settings = settings_for("nats://127.0.0.1:9", nats_tls_cert=cert, nats_tls_key=cert)
    with pytest.raises(ConfigError) as caught:
        await NatsBus(settings, Metrics()).connect(budget=5)
    assert caught.value.variable == "SCHEDULER_NATS_TLS_CERT/SCHEDULER_NATS_TLS_KEY"


# -- secrets stay secret --------------------------------------------------------------------------


async def test_a_running_daemon_shows_no_secret_in_logs_repr_or_readyz(
    start_nats: StartNats,
    pki: dict[str, Path],
    database_url: str,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under mutual TLS with an NKey seed, the daemon starts and is ready; neither its logs,
    its settings' repr nor /readyz hold the seed."""
    url = await asyncio.to_thread(start_nats, tls_block(pki, verify=True) + NKEYS)
    (tmp_path / "schedules").mkdir()
    settings = Settings(
        nats_url=url,
        nats_nkey_seed=SEED,
        nats_tls_ca=pki["ca"],
        nats_tls_cert=pki["client_cert"],
        nats_tls_key=pki["client_key"],
        database_url=database_url,
        schedules_dir=tmp_path / "schedules",
        data_dir=tmp_path / "data",
        http_port=0,
        metrics_port=0,
        instance_id="auth-1",
        lease_ttl=3,
    )
    caplog.set_level("DEBUG")
    runner = DaemonRunner(settings)
    daemon = await runner.start()
    try:
        await wait_until(lambda: daemon.readiness()[0], 10)
        body = json.dumps(daemon.readiness()[1]) + await served_text(daemon)
    finally:
        await runner.stop()
    assert '"ready":true' in body.replace(" ", "") and "mq_scheduler_" in body, body
    for text in (caplog.text, repr(settings), str(settings), body):
        assert SEED not in text
        assert SEED[2:20] not in text
