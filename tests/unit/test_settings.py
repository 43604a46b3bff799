"""Settings: every default of README.md ("Configuration"), precise errors naming the variable,
redaction."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from scheduler.errors import ConfigError
from scheduler.settings import load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("SCHEDULER_"):
            monkeypatch.delenv(key)


def test_defaults_match_the_design() -> None:
    """Every variable of the configuration table has its documented default."""
    s = load_settings()
    assert s.nats_url is None and s.database_url is None
    assert s.nats_creds is None and s.nats_user is None and s.nats_password is None
    assert s.nats_tls_ca is None
    assert s.schedules_dir == Path("schedules")
    assert s.instance_id  # host name + pid
    assert s.lease_ttl == 5
    assert (s.http_port, s.metrics_port) == (8055, 9090)
    assert s.admin_token is None and s.read_token is None
    assert (s.intake_stream, s.intake_subject) == ("MQ_DELAY", "mq.delay.>")
    assert s.target_allow == ["mq.>"]
    assert s.provision is True
    assert s.http_host == "127.0.0.1"
    assert s.horizon == timedelta(minutes=5)
    assert s.batch == 1000
    assert (s.max_attempts, s.backoff) == (5, timedelta(seconds=1))
    assert s.campaign_interval == timedelta(seconds=0.5)
    assert s.effective_fence_margin == 1.0  # max(0.5 s, 5 s / 5)
    assert s.intake_ack_wait == timedelta(seconds=10)
    assert s.fire_log_retention == 14
    assert s.dispatch_coalesce == timedelta(0)  # every due millisecond
    assert s.intent_ttl == timedelta(hours=24)
    assert s.intent_max_per_target == 10_000
    assert s.partitions == 1  # one leader fires everything, as before partitions


def test_environment_variables_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """SCHEDULER_* variables set the fields, with durations and comma lists parsed."""
    monkeypatch.setenv("SCHEDULER_NATS_URL", "nats://a:4222, nats://b:4222")
    monkeypatch.setenv("SCHEDULER_LEASE_TTL", "3")
    monkeypatch.setenv("SCHEDULER_HORIZON", "90s")
    monkeypatch.setenv("SCHEDULER_TARGET_ALLOW", "mq.inference.>, mq.batch.*")
    monkeypatch.setenv("SCHEDULER_PROVISION", "false")
    monkeypatch.setenv("SCHEDULER_FENCE_MARGIN", "250ms")
    s = load_settings()
    assert s.nats_servers == ["nats://a:4222", "nats://b:4222"]
    assert s.lease_ttl == 3
    assert s.horizon == timedelta(seconds=90)
    assert s.target_allow == ["mq.inference.>", "mq.batch.*"]
    assert s.provision is False
    assert s.effective_fence_margin == 0.25


def test_fence_margin_default_scales_with_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without SCHEDULER_FENCE_MARGIN the margin is max(0.5 s, TTL/5)."""
    monkeypatch.setenv("SCHEDULER_LEASE_TTL", "2")
    assert load_settings().effective_fence_margin == 0.5
    monkeypatch.setenv("SCHEDULER_LEASE_TTL", "30")
    assert load_settings().effective_fence_margin == 6.0


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("SCHEDULER_LEASE_TTL", "-1", "greater than 0"),
        ("SCHEDULER_LEASE_TTL", "soon", "valid number"),
        ("SCHEDULER_HTTP_PORT", "70000", "less than or equal to 65535"),
        ("SCHEDULER_HORIZON", "5x", "is not a duration"),
        ("SCHEDULER_BACKOFF", "-1s", "is not a duration"),
        ("SCHEDULER_BATCH", "0", "greater than or equal to 1"),
        ("SCHEDULER_PROVISION", "maybe", "valid boolean"),
        ("SCHEDULER_TARGET_ALLOW", " , ", "at least one subject pattern"),
        ("SCHEDULER_DATABASE_URL", "mysql://x@h/db", "must start with postgresql://"),
        ("SCHEDULER_DATABASE_URL", "postgresql:///db", "names no host"),
        ("SCHEDULER_LOG_LEVEL", "chatty", "must be one of"),
        ("SCHEDULER_DISPATCH_COALESCE", "1s", "must be at most 100ms"),
        ("SCHEDULER_API_MAX_BODY", "lots", "SCHEDULER_API_MAX_BODY"),
        ("SCHEDULER_API_ALLOWED_HOSTS", "ok.example,http://x", "not a host name"),
        ("SCHEDULER_API_ALLOWED_HOSTS", "sched.example:8055", "no scheme, port or path"),
        ("SCHEDULER_INTENT_TTL", "30s", "must be between 1m and 30d"),
        ("SCHEDULER_INTENT_TTL", "31d", "must be between 1m and 30d"),
        ("SCHEDULER_INTENT_TTL", "soon", "is not a duration"),
        ("SCHEDULER_INTENT_MAX_PER_TARGET", "0", "greater than or equal to 1"),
        ("SCHEDULER_INTENT_MAX_PER_TARGET", "10000001", "less than or equal to 10000000"),
        ("SCHEDULER_INTENT_MAX_PER_TARGET", "many", "valid integer"),
        ("SCHEDULER_PARTITIONS", "0", "greater than or equal to 1"),
        ("SCHEDULER_PARTITIONS", "4097", "less than or equal to 4096"),
        ("SCHEDULER_PARTITIONS", "1.5", "valid integer"),
        ("SCHEDULER_PARTITIONS", "many", "valid integer"),
    ],
)
def test_wrong_values_name_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    """A wrong value fails with a ConfigError naming the variable and the problem."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert info.value.variable == variable
    assert str(info.value).startswith(f"{variable}: ")
    assert message in str(info.value)


def test_fence_margin_must_be_shorter_than_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fence margin at or above the lease TTL is refused."""
    monkeypatch.setenv("SCHEDULER_LEASE_TTL", "2")
    monkeypatch.setenv("SCHEDULER_FENCE_MARGIN", "2s")
    with pytest.raises(ConfigError, match=r"^SCHEDULER_FENCE_MARGIN: must be shorter"):
        load_settings()


def test_unix_socket_database_url_is_accepted() -> None:
    """pgserver's `postgresql://user@/db?host=/path` form is valid and passed on as is."""
    s = load_settings(database_url="postgresql://postgres:@/postgres?host=/tmp/pg")
    assert s.database_dsn == "postgresql://postgres:@/postgres?host=/tmp/pg"


def test_driver_scheme_is_normalised() -> None:
    """A `postgresql+asyncpg://` URL is accepted and handed to asyncpg as `postgresql://`."""
    s = load_settings(database_url="postgresql+asyncpg://u@db.example/app")
    assert s.database_dsn == "postgresql://u@db.example/app"


def test_secrets_never_show_in_repr_or_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """Passwords and tokens are redacted in repr, and a bad URL's error hides the URL."""
    s = load_settings(
        database_url="postgresql://app:hunter2@db/app",
        nats_password="s3cret",
        admin_token="tok-admin",
    )
    text = repr(s) + str(s)
    for secret in ("hunter2", "s3cret", "tok-admin"):
        assert secret not in text
    assert s.redacted_database_url == "postgresql://app:***@db/app"
    monkeypatch.setenv("SCHEDULER_DATABASE_URL", "mysql://app:hunter2@db/app")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert "hunter2" not in str(info.value)


def test_config_file_sets_keys_and_environment_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A YAML config file sets fields; an environment variable overrides the file."""
    config = tmp_path / "scheduler.yaml"
    config.write_text("lease_ttl: 7\nhorizon: 2m\nbatch: 50\n")
    monkeypatch.setenv("SCHEDULER_BATCH", "75")
    monkeypatch.setenv("SCHEDULER_CONFIG", str(config))
    s = load_settings()
    assert s.lease_ttl == 7
    assert s.horizon == timedelta(minutes=2)
    assert s.batch == 75


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    """Naming a config file that does not exist fails with SCHEDULER_CONFIG named."""
    with pytest.raises(ConfigError, match="SCHEDULER_CONFIG: config file"):
        load_settings(tmp_path / "nope.yaml")


def test_unknown_config_file_key_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A misspelt key in the config file is refused rather than ignored."""
    config = tmp_path / "scheduler.yaml"
    config.write_text("lease_tll: 7\n")
    monkeypatch.setenv("SCHEDULER_CONFIG", str(config))
    with pytest.raises(ConfigError, match="SCHEDULER_LEASE_TLL"):
        load_settings()


SEED = "SUAM" + "A" * 54  # the shape of a user seed; never used to connect here


def test_nats_credentials_and_tls_files_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SCHEDULER_NATS_TOKEN, _NKEY_SEED, _TLS_CA, _TLS_CERT and _TLS_KEY set their fields."""
    for name in ("ca.pem", "client.crt", "client.key"):
        (tmp_path / name).write_text("x")
    monkeypatch.setenv("SCHEDULER_NATS_NKEY_SEED", SEED)
    monkeypatch.setenv("SCHEDULER_NATS_TLS_CA", str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SCHEDULER_NATS_TLS_CERT", str(tmp_path / "client.crt"))
    monkeypatch.setenv("SCHEDULER_NATS_TLS_KEY", str(tmp_path / "client.key"))
    s = load_settings()
    assert s.nats_nkey_seed is not None and s.nats_nkey_seed.get_secret_value() == SEED
    assert (s.nats_tls_ca, s.nats_tls_cert, s.nats_tls_key) == (
        tmp_path / "ca.pem",
        tmp_path / "client.crt",
        tmp_path / "client.key",
    )
    monkeypatch.delenv("SCHEDULER_NATS_NKEY_SEED")
    monkeypatch.setenv("SCHEDULER_NATS_TOKEN", "tok-nats")
    assert load_settings().nats_token.get_secret_value() == "tok-nats"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("fields", "variable", "message"),
    [
        ({"nats_tls_ca": "/no/such/ca.pem"}, "SCHEDULER_NATS_TLS_CA", "no such file"),
        ({"nats_creds": "/no/such.creds"}, "SCHEDULER_NATS_CREDS", "no such file"),
        ({"nats_creds": "FILE"}, "SCHEDULER_NATS_CREDS", "not a NATS credentials file"),
        ({"nats_tls_cert": "FILE"}, "SCHEDULER_NATS_TLS_KEY", "go together"),
        ({"nats_tls_key": "FILE"}, "SCHEDULER_NATS_TLS_CERT", "go together"),
        ({"nats_nkey_seed": "SUshort"}, "SCHEDULER_NATS_NKEY_SEED", "neither a user seed"),
        ({"nats_nkey_seed": "FILE"}, "SCHEDULER_NATS_NKEY_SEED", "holds no user seed"),
        ({"nats_token": "t", "nats_user": "u"}, "SCHEDULER_NATS_TOKEN", "one way to authenticate"),
        ({"nats_creds": "CREDS", "nats_nkey_seed": SEED}, "SCHEDULER_NATS_CREDS", "one way"),
        ({"database_password_file": "/no/pw"}, "SCHEDULER_DATABASE_PASSWORD_FILE", "no such file"),
    ],
)
def test_wrong_credential_settings_name_the_variable(
    tmp_path: Path, fields: dict[str, str], variable: str, message: str
) -> None:
    """Missing files, half a client certificate, a malformed seed or two ways to authenticate
    are refused at load, naming the variable to fix."""
    some_file = tmp_path / "file"
    some_file.write_text("not a seed\n")
    creds = tmp_path / "user.creds"
    creds.write_text(f"-----BEGIN NATS USER JWT-----\naaa.bbb.ccc\n------END\n{SEED}\n")
    files = {"FILE": str(some_file), "CREDS": str(creds)}
    values = {k: files.get(v, v) for k, v in fields.items()}
    with pytest.raises(ConfigError) as info:
        load_settings(**values)
    assert info.value.variable == variable, str(info.value)
    assert message in str(info.value)


def test_cross_field_errors_never_show_the_other_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check across fields names its variable and shows no input: the database password and
    the NATS token given beside it stay hidden."""
    monkeypatch.setenv("SCHEDULER_DATABASE_URL", "postgresql://app:hunter2@db/app")
    with pytest.raises(ConfigError) as info:
        load_settings(nats_token="tok-nats", nats_user="app", fence_margin="10s")
    text = str(info.value)
    assert "hunter2" not in text and "tok-nats" not in text, text


def test_nats_secrets_never_show_in_repr(tmp_path: Path) -> None:
    """A NATS token and an NKey seed are redacted in repr and str; so is a bad seed's error."""
    s = load_settings(nats_token="tok-nats")
    assert "tok-nats" not in repr(s) + str(s)
    s = load_settings(nats_nkey_seed=SEED)
    assert SEED not in repr(s) + str(s)
    with pytest.raises(ConfigError) as info:
        load_settings(nats_nkey_seed=SEED[:-1])
    assert SEED[:-1] not in str(info.value)


def test_database_password_file_is_read_once_and_never_shown(tmp_path: Path) -> None:
    """SCHEDULER_DATABASE_PASSWORD_FILE's content (trailing newline dropped) is the password of
    the URL's user, quoted for the URL, absent from repr and the redacted URL; read at load,
    so a later change of the file needs a restart."""
    secret = tmp_path / "password"
    secret.write_text("p@ss:w/rd%\n")
    s = load_settings(
        database_url="postgresql://app@db/app?sslmode=verify-full", database_password_file=secret
    )
    assert s.database_dsn == "postgresql://app:p%40ss%3Aw%2Frd%25@db/app?sslmode=verify-full"
    assert s.redacted_database_url == "postgresql://app:***@db/app?sslmode=verify-full"
    assert "p@ss" not in repr(s) + str(s)
    secret.write_text("rotated\n")
    assert "rotated" not in (s.database_dsn or "")
    assert "rotated" in (s.with_overrides(lease_ttl=3).database_dsn or "")


@pytest.mark.parametrize(
    ("url", "content", "message"),
    [
        ("postgresql://app:inline@db/app", "pw", "has a password too"),
        ("postgresql://app@db/app", "\n", "is empty"),
        ("postgresql:///app?host=/run/pg", "pw", "names no user"),
    ],
)
def test_database_password_file_conflicts_are_refused(
    tmp_path: Path, url: str, content: str, message: str
) -> None:
    """A password in the URL and in the file, or an empty file, is refused naming the file."""
    secret = tmp_path / "password"
    secret.write_text(content)
    with pytest.raises(ConfigError) as info:
        load_settings(database_url=url, database_password_file=secret)
    assert info.value.variable == "SCHEDULER_DATABASE_PASSWORD_FILE"
    assert message in str(info.value) and "inline" not in str(info.value)


def test_api_edge_settings_parse_sizes_and_host_lists(monkeypatch: pytest.MonkeyPatch) -> None:
    """SCHEDULER_API_MAX_BODY takes sizes as SCHEDULER_ARMED_MAX_BYTES does; the Host list is
    split on commas, lower-cased, IPv6 brackets dropped; the defaults are 1 MiB and empty."""
    assert load_settings().api_max_body == 1024 * 1024
    assert load_settings().api_allowed_hosts == []
    monkeypatch.setenv("SCHEDULER_API_MAX_BODY", "512KB")
    monkeypatch.setenv("SCHEDULER_API_ALLOWED_HOSTS", " Sched.Example , *.internal,[fd00::1],*")
    s = load_settings()
    assert s.api_max_body == 512_000
    assert s.api_allowed_hosts == ["sched.example", "*.internal", "fd00::1", "*"]


def test_intent_settings_are_read_at_their_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """SCHEDULER_INTENT_TTL accepts 1m and 30d exactly; the cap accepts 1."""
    monkeypatch.setenv("SCHEDULER_INTENT_TTL", "1m")
    monkeypatch.setenv("SCHEDULER_INTENT_MAX_PER_TARGET", "1")
    s = load_settings()
    assert s.intent_ttl == timedelta(minutes=1) and s.intent_max_per_target == 1
    monkeypatch.setenv("SCHEDULER_INTENT_TTL", "30d")
    assert load_settings().intent_ttl == timedelta(days=30)
