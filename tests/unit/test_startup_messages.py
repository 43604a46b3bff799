"""Start-up errors in words: each failure is classified (retry or give up), named by the setting
to fix, and the lines docs/operations.md quotes are the lines the code prints."""

from __future__ import annotations

import errno
import socket
import ssl
from pathlib import Path

import asyncpg
import pytest
from nats import errors as nats_errors

from scheduler.bus.nats.connection import (
    describe_connect_error,
    nats_refused,
    nats_unavailable,
    permanent_connect_error,
)
from scheduler.daemon.listeners import listen_error
from scheduler.settings import Settings
from scheduler.store.postgres.connect import connect_problem, refused, unavailable

OPERATIONS = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
DSN = "postgresql://app:s3cret@db:5432/app"


def documented(error: Exception, prefix: str = "scheduler: configuration error: ") -> str:
    line = f"{prefix}{error}"
    assert f"`{line}`" in OPERATIONS, f"docs/operations.md does not quote: {line}"
    return line


@pytest.mark.parametrize(
    ("exc", "cause", "retry"),
    [
        (ConnectionRefusedError(111, "Connection refused"), "connection refused", True),
        (socket.gaierror(-2, "Name or service not known"), "unknown host (Name or", True),
        (TimeoutError(), "timed out (nothing answered)", True),
        (asyncpg.CannotConnectNowError("the database system is starting up"), "the database", True),
        (asyncpg.TooManyConnectionsError("sorry, too many clients already"), "sorry, too", True),
        (
            asyncpg.InvalidPasswordError('password authentication failed for user "app"'),
            'password authentication failed for user "app"; check the user and password',
            False,
        ),
        (
            asyncpg.InvalidAuthorizationSpecificationError('role "nobody" does not exist'),
            'role "nobody" does not exist; check the user in the URL',
            False,
        ),
        (
            asyncpg.InvalidCatalogNameError('database "nope" does not exist'),
            'database "nope" does not exist; create it (CREATE DATABASE)',
            False,
        ),
        (ssl.SSLCertVerificationError(1, "certificate verify failed"), "TLS failed", False),
        (
            ConnectionError('PostgreSQL server at "db:4222" rejected SSL upgrade'),
            "no PostgreSQL answers there",
            False,
        ),
    ],
)
def test_postgres_connect_failures_are_classified(exc: Exception, cause: str, retry: bool) -> None:
    """A refused, unresolvable or slow server is retried; credentials, an unknown database,
    TLS or another protocol on the port are not, and each cause says what to check."""
    problem = connect_problem(exc, DSN)
    assert problem is not None
    assert problem[0].startswith(cause) and problem[1] is retry


def test_a_bug_is_not_taken_for_a_connection_problem() -> None:
    """An exception that is no connection problem is left to raise (a traceback for a bug)."""
    assert connect_problem(KeyError("x"), DSN) is None


@pytest.mark.parametrize(
    ("exc", "cause"),
    [
        (ConnectionRefusedError(111, "Connection refused"), "connection refused"),
        (socket.gaierror(-2, "Name or service not known"), "unknown host (Name or service"),
        (TimeoutError(), "timed out (nothing answered)"),
        (nats_errors.Error("nats: 'Authorization Violation'"), "credentials refused"),
        (ssl.SSLError(1, "[SSL] record layer failure"), "TLS failed"),
    ],
)
def test_nats_connect_failures_are_described(exc: Exception, cause: str) -> None:
    """nats-py's connect errors become a few words naming the cause."""
    assert describe_connect_error(exc).startswith(cause)


def test_refused_nats_credentials_name_the_setting_that_carries_them() -> None:
    """Refused credentials name the URL, or the user/password or creds settings when set."""
    denied = nats_errors.Error("nats: 'Authorization Violation'")
    plain = Settings(nats_url="nats://app:pw@nats:4222")
    assert permanent_connect_error(denied, plain) == "SCHEDULER_NATS_URL"
    user = Settings(nats_url="nats://nats:4222", nats_user="app", nats_password="pw")
    assert permanent_connect_error(denied, user) == "SCHEDULER_NATS_USER/SCHEDULER_NATS_PASSWORD"
    assert permanent_connect_error(ConnectionRefusedError(), plain) is None
    token = Settings(nats_url="nats://nats:4222", nats_token="t")
    assert permanent_connect_error(denied, token) == "SCHEDULER_NATS_TOKEN"
    nkey = Settings(nats_url="nats://nats:4222", nats_nkey_seed="SUAM" + "A" * 54)
    assert permanent_connect_error(denied, nkey) == "SCHEDULER_NATS_NKEY_SEED"


def test_tls_failures_name_the_ca_or_the_client_certificate() -> None:
    """A server certificate we cannot verify names SCHEDULER_NATS_TLS_CA; an alert from the
    server (it refused or wanted a client certificate) names SCHEDULER_NATS_TLS_CERT."""
    s = Settings(nats_url="nats://nats:4222")
    unverified = ssl.SSLCertVerificationError(1, "certificate verify failed")
    unverified.verify_message = "certificate has expired"
    assert permanent_connect_error(unverified, s) == "SCHEDULER_NATS_TLS_CA"
    assert describe_connect_error(unverified) == (
        "TLS failed: the server's certificate: certificate has expired"
    )
    alert = ssl.SSLError(1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED]")
    alert.reason = "TLSV13_ALERT_CERTIFICATE_REQUIRED"
    assert permanent_connect_error(alert, s) == "SCHEDULER_NATS_TLS_CERT"
    assert "requires a client certificate" in describe_connect_error(alert)


def test_the_documented_lines_are_the_printed_ones() -> None:
    """docs/operations.md quotes, word for word, the lines these failures print."""
    host = "127.0.0.1"
    in_use = OSError(errno.EADDRINUSE, "Address already in use")
    documented(listen_error(in_use, "SCHEDULER_HTTP_PORT", host, 8055))
    denied = OSError(errno.EACCES, "Permission denied")
    documented(listen_error(denied, "SCHEDULER_METRICS_PORT", "0.0.0.0", 80))
    elsewhere = OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address")
    documented(listen_error(elsewhere, "SCHEDULER_HTTP_PORT", "10.1.2.3", 8055))
    nats = Settings(nats_url="nats://nats:4222")
    refused_conn = ConnectionRefusedError(111, "Connection refused")
    documented(nats_unavailable(nats, refused_conn, 60), "scheduler: ")
    auth = nats_errors.Error("nats: 'Authorization Violation'")
    app = Settings(nats_url="nats://app:pw@nats:4222")
    documented(nats_refused(app, "SCHEDULER_NATS_URL", auth))
    documented(unavailable(DSN, "connection refused", 60), "scheduler: ")
    for exc, dsn in [
        (asyncpg.InvalidPasswordError('password authentication failed for user "app"'), DSN),
        (
            asyncpg.InvalidAuthorizationSpecificationError('role "nobody" does not exist'),
            "postgresql://nobody:pw@db:5432/app",
        ),
        (
            asyncpg.InvalidCatalogNameError('database "nope" does not exist'),
            "postgresql://app:pw@db:5432/nope",
        ),
        (
            ConnectionError('PostgreSQL server at "db:4222" rejected SSL upgrade'),
            "postgresql://app@db:4222/app",
        ),
    ]:
        problem = connect_problem(exc, dsn)
        assert problem is not None
        documented(refused(dsn, problem[0]))
